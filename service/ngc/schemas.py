"""NGC's response shapes, with the fields `ngcsdk` (ngcbase) reads."""

from __future__ import annotations

from pydantic import BaseModel, Field

#: how this server's credentials present themselves: keys of an account (an NGC org), not of a
#: user. ngcsdk then skips its user and org look-ups (`_check_org`: "Service key detected").
SERVICE_KEY = "SERVICE_KEY"
#: the NGC product of NVCF keys
PRODUCTS = ["nv-cloud-functions"]

#: HTTP status -> NGC `requestStatus.statusCode`
STATUS_CODES = {
    400: "INVALID_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    408: "TIMEOUT",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "INVALID_REQUEST_DATA",
    429: "TOO_MANY_REQUESTS",
    503: "SERVICE_UNAVAILABLE",
}


class RequestStatus(BaseModel):
    statusCode: str = Field(examples=["SUCCESS"])
    statusDescription: str | None = None
    requestId: str


class CallerInfo(BaseModel):
    """`POST /v3/keys/get-caller-info`: whom a credential belongs to."""

    type: str = Field(
        description="Always SERVICE_KEY: credentials belong to an account, not to a user",
        examples=[SERVICE_KEY],
    )
    orgName: str = Field(description="The NGC org of the credential: this server's account id")
    products: list[str] = Field(examples=[PRODUCTS])
    requestStatus: RequestStatus


class Organization(BaseModel):
    name: str = Field(description="The org's unique name: this server's account id")
    displayName: str
    description: str
    type: str = Field(examples=["ENTERPRISE"])


class PaginationInfo(BaseModel):
    index: int
    size: int
    totalResults: int
    totalPages: int


class OrgList(BaseModel):
    """`GET /v2/orgs`: the orgs the caller belongs to, which is its account."""

    organizations: list[Organization]
    paginationInfo: PaginationInfo
    requestStatus: RequestStatus


class NgcError(BaseModel):
    """An error: problem+json whose `requestStatus` is NGC's error shape."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    requestId: str
    requestStatus: RequestStatus
