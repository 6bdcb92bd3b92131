"""ngcsdk 4.37's requests, replayed byte for byte, and its decoding of the answers.

`ngcsdk` is proprietary, a test dependency only (tests/observability/test_ngcsdk.py drives
the package itself): `NgcSdk` sends what it sends (recorded from `Client().configure(...)`
and `cloud_function.functions` / `.deployments` against this server over HTTPS) and reads
the answers the way its code does (ngcbase `Authentication`, `Configuration`, `Connection`;
nvcf `FunctionAPI`, `DeployAPI`, `TargetedDeploymentSpecification`).

What it sends:
- the key check, `Authentication.get_sak_key_details`: `POST /v3/keys/get-caller-info`, a form
  body `credentials=<key>` (requests' urlencoding), `Content-Type:
  application/x-www-form-urlencoded`, no Authorization header, python-requests' User-Agent;
  an HTTP error becomes `AuthenticationException("Invalid SAK key: ...")`;
- every other call, `Connection.make_api_request`: `Authorization: Bearer <key or JWT>` (an
  `nvapi-` key or a JWT is sent as is: no token exchange), `nv-ngc-org: <org>`,
  `Content-Type: application/json` even without a body, `User-Agent: ngcsdk/4.37.0  <platform>`,
  bodies `json.dumps(payload)` (default separators); any status of 400 or more raises the
  exception class of `get_api_error_class`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import httpx

SDK_AGENT = "ngcsdk/4.37.0  linux-x86_64"
REQUESTS_AGENT = "python-requests/2.34.2"
SCOPED_KEY_PREFIX = "nvapi-"


class NgcError(Exception):
    """What ngcsdk raises for an error status (`get_api_error_class`)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code} {response.text}")
        self.response = response
        self.status = response.status_code


class AuthenticationException(NgcError):  # 401
    pass


class AccessDeniedException(NgcError):  # 403
    pass


class ResourceNotFoundException(NgcError):  # 404
    pass


class BadRequestException(NgcError):  # 400
    pass


class ConfigError(Exception):
    """`configure` refusing the configuration (ngcsdk: NgcException / ValueError)."""


_CLASSES = {
    400: BadRequestException,
    401: AuthenticationException,
    403: AccessDeniedException,
    404: ResourceNotFoundException,
}


def namespace(value: Any) -> Any:
    """ngcbase's `NameSpaceObj` / `DotDict`: attribute access all the way down."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [namespace(v) for v in value]
    return value


def spec_from_dict(in_dict: dict[str, Any]) -> dict[str, Any]:
    """`TargetedDeploymentSpecification.from_dict` then `.to_dict()`: the keys it requires
    (`gpu`, `minInstances`, `maxInstances`, `instanceType`: a KeyError in ngcsdk otherwise),
    their types, and what it sends back."""
    spec = {
        "gpu": in_dict["gpu"],
        "minInstances": int(in_dict["minInstances"]),
        "maxInstances": int(in_dict["maxInstances"]),
        "instanceType": in_dict["instanceType"],
        "maxRequestConcurrency": in_dict.get("maxRequestConcurrency", 1),
        "regions": in_dict.get("regions", []),
        "preferredOrder": 1,
        "gpuSpecificationId": in_dict.get("gpuSpecificationId"),
    }
    return {k: v for k, v in spec.items() if v or v == 0}


@dataclass
class Sent:
    method: str
    path: str
    status: int


class NgcSdk:
    """One configured `ngcsdk.Client` over `client` (which carries no credential itself)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.key: str | None = None
        self.org: str | None = None
        self.sent: list[Sent] = []

    # ngcbase: Authentication.get_sak_key_details

    async def caller_info(self, key: str) -> Any:
        request = self.client.build_request(
            "POST",
            "/v3/keys/get-caller-info",
            content=urlencode({"credentials": key}),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "User-Agent": REQUESTS_AGENT,
            },
        )
        request.headers.pop("Authorization", None)  # an open endpoint: no credential header
        resp = await self.client.send(request)
        self.sent.append(Sent("POST", "/v3/keys/get-caller-info", resp.status_code))
        if resp.status_code >= 400:
            raise AuthenticationException(resp)
        return namespace(resp.json())

    # ngcbase: Connection.make_api_request

    async def request(
        self, method: str, endpoint: str, payload: dict[str, Any] | None = None
    ) -> httpx.Response:
        assert self.key is not None
        headers = {
            "Content-Type": "application/json",
            "User-Agent": SDK_AGENT,
            "Authorization": f"Bearer {self.key}",
        }
        if self.org:
            headers["nv-ngc-org"] = self.org
        content = json.dumps(payload) if payload is not None else None
        resp = await self.client.request(method, "/" + endpoint, content=content, headers=headers)
        path = "/" + endpoint.split("?", 1)[0]
        self.sent.append(Sent(method, path, resp.status_code))
        if resp.status_code >= 400:
            raise _CLASSES.get(resp.status_code, NgcError)(resp)
        return resp

    async def api(self, method: str, endpoint: str, payload: dict[str, Any] | None = None) -> Any:
        """A call whose answer ngcsdk parses (`json_response=True`): JSON or an error."""
        return (await self.request(method, endpoint, payload)).json()

    # ngcsdk: Client.configure, ngcbase: Configuration.validate_configuration

    async def configure(self, api_key: str, org_name: str | None = None) -> None:
        self.key = api_key
        if api_key.startswith(SCOPED_KEY_PREFIX):
            key_org = (await self.caller_info(api_key)).orgName
            assert isinstance(key_org, str)
            self.org = org_name or key_org
            if self.org != key_org:
                raise ConfigError(
                    f"Provided organization: '{self.org}', doesn't match organization for "
                    f"which API Key has permissions:'{key_org}'"
                )
        else:  # a JWT: org as given
            self.org = org_name
        await self.validate(remote=True)

    async def validate(self, remote: bool = False) -> None:
        """`validate_configuration`, run before every call (remote only by configure)."""
        assert self.key is not None
        if self.key.startswith(SCOPED_KEY_PREFIX):
            details = await self.caller_info(self.key)
            if details.type == "SERVICE_KEY":
                return  # "Service key detected. Skipping org validation."
            if remote and self.org != details.orgName:
                raise ConfigError(f"Invalid org. Choose from ['{details.orgName}'].")
            return
        if remote and self.org:
            page = namespace(await self.api("GET", "v2/orgs?page-size=500"))
            names = [org.name for org in page.organizations]
            info = page.paginationInfo
            assert not info.totalResults > info.size  # else it would ask for more pages
            if self.org not in names:
                raise ConfigError(f"Invalid org. Choose from {names}.")

    # nvcf: FunctionAPI

    def _fn_ep(self, function_id: str | None = None, version_id: str | None = None) -> str:
        assert self.org is not None
        parts = ["v2/orgs", self.org, "nvcf", "functions"]
        if function_id:
            parts += [function_id, "versions"]
        if version_id:
            parts.append(version_id)
        return "/".join(parts)

    def _deploy_ep(self, function_id: str, version_id: str) -> str:
        assert self.org is not None
        parts = ["v2", "orgs", self.org, "nvcf", "deployments", "functions", function_id]
        return "/".join([*parts, "versions", version_id])

    async def registry_image_info(self, image: str) -> None:
        """`nvcf.api.utils.validate_transform_image` for an nvcr.io image: 403 means go on
        (AccessDeniedException: a warning), 404 stops the create."""
        org, _, rest = image.removeprefix("nvcr.io/").partition("/")
        name, _, tag = rest.partition(":")
        # "Current API key couldn't get access to resource ... Proceeding."
        with contextlib.suppress(AccessDeniedException):
            await self.request("GET", f"v2/org/{org}/repos/{name}/images/{tag}")

    async def create_function(self, body: dict[str, Any]) -> Any:
        """`body` as ngcsdk builds it (its keys in its order, the unset ones left out)."""
        await self.validate()
        image = body.get("containerImage")
        if image and "docker.io" not in image:
            await self.registry_image_info(image)
        return namespace(await self.api("POST", self._fn_ep(), body))

    async def list_functions(self, function_id: str | None = None) -> Any:
        await self.validate()
        return namespace(await self.api("GET", self._fn_ep(function_id)))

    async def info(self, function_id: str, version_id: str) -> Any:
        await self.validate()
        return namespace(await self.api("GET", self._fn_ep(function_id, version_id)))

    async def update_function(
        self, function_id: str, version_id: str, payload: dict[str, Any]
    ) -> str:
        await self.validate()
        resp = await self.request("PUT", self._fn_ep(function_id, version_id), payload)
        return resp.text  # json_response=False

    async def delete_function(self, function_id: str, version_id: str) -> str:
        await self.validate()
        resp = await self.request("DELETE", self._fn_ep(function_id, version_id))
        return resp.text  # json_response=False

    # nvcf: DeployAPI

    async def deployment_info(self, function_id: str, version_id: str) -> Any:
        await self.validate()
        return namespace(await self.api("GET", self._deploy_ep(function_id, version_id)))

    async def deploy(self, function_id: str, version_id: str, specs: list[dict[str, Any]]) -> Any:
        await self.validate()
        fn = await self.info(function_id, version_id)
        assert hasattr(fn.function, "containerImage") or hasattr(fn.function, "helmChart")
        try:
            await self.deployment_info(function_id, version_id)
            raise AssertionError("This function already has a deployment")
        except ResourceNotFoundException:
            pass
        body = {"deploymentSpecifications": specs}
        return namespace(await self.api("POST", self._deploy_ep(function_id, version_id), body))

    async def update_deployment(
        self, function_id: str, version_id: str, specs: list[dict[str, Any]]
    ) -> Any:
        await self.validate()
        await self.info(function_id, version_id)
        current = await self.deployment_info(function_id, version_id)
        previous = [spec_from_dict(vars(s)) for s in current.deployment.deploymentSpecifications]
        assert len(previous) == len(specs)
        specs = [
            {**s, "gpuSpecificationId": p["gpuSpecificationId"]}
            for s, p in zip(specs, previous, strict=True)
        ]
        body = {"deploymentSpecifications": specs}
        return namespace(await self.api("PUT", self._deploy_ep(function_id, version_id), body))

    async def list_deployments(self) -> Any:
        await self.validate()
        assert self.org is not None
        return namespace(await self.api("GET", f"v2/orgs/{self.org}/nvcf/deployments"))

    async def delete_deployment(self, function_id: str, version_id: str) -> Any:
        await self.validate()
        return await self.api("DELETE", self._deploy_ep(function_id, version_id))
