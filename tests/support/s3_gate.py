"""moto's S3 server behind a gate that checks pre-signed URLs as S3 does (moto checks none:
it verifies only `Authorization` headers, and only when IAM enforcement is switched on).

Run as `python -m tests.support.s3_gate -p PORT` (tests/support/s3.py starts it). A request
with `X-Amz-Signature` in its query is checked by S3's rules for SigV4 query authentication
before moto sees it; a mismatch is S3's 403 with its error code:

- the signature, recomputed with botocore's own signer over the request as it arrived: the
  method, the path, every query parameter but the signature, and the values of the headers
  it names in `X-Amz-SignedHeaders` (a signed header sent with another value or not at all
  does not match) — `SignatureDoesNotMatch`;
- any `x-amz-*` header the signature does not cover (S3: "There were headers present in the
  request which were not signed") — `AccessDenied`;
- the expiry (`X-Amz-Date` + `X-Amz-Expires`) — `AccessDenied`, "Request has expired".

A request with neither a signature nor an `Authorization` header (an anonymous request to a
private bucket) is refused; requests signed in their `Authorization` header (boto3's own
calls in the tests) go to moto as they are.
"""

from __future__ import annotations

import argparse
import hmac
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from werkzeug.serving import run_simple
from werkzeug.wrappers import Request, Response

#: the store's only credentials (the asset settings of tests/support/s3.py use them)
ACCESS_KEY = "test-access-key"
SECRET_KEY = "test-secret-key"
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _error(code: str, message: str) -> Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    )
    return Response(body, status=403, content_type="application/xml")


def refusal(request: Request) -> Response | None:
    """Why S3 would refuse this request (None: it would not)."""
    query = parse_qsl(request.query_string.decode(), keep_blank_values=True)
    params = dict(query)
    if "X-Amz-Signature" not in params:
        if request.headers.get("Authorization") or request.path.startswith("/moto-api"):
            return None
        return _error("AccessDenied", "Access Denied")
    try:
        access_key, date, region, service, _ = params["X-Amz-Credential"].split("/")
        stamp = datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        expires = int(params["X-Amz-Expires"])
        signed = params["X-Amz-SignedHeaders"].split(";")
    except (KeyError, ValueError):
        return _error("AuthorizationQueryParametersError", "malformed query authentication")
    if access_key != ACCESS_KEY:
        return _error("InvalidAccessKeyId", "The AWS Access Key Id does not exist")
    if datetime.now(UTC) > stamp + timedelta(seconds=expires):
        return _error("AccessDenied", "Request has expired")
    unsigned = sorted(
        name.lower()
        for name, _value in request.headers.items()
        if name.lower().startswith("x-amz-") and name.lower() not in signed
    )
    if unsigned:
        return _error(
            "AccessDenied",
            "There were headers present in the request which were not signed: "
            + ", ".join(unsigned),
        )
    headers = {name: request.headers.get(name, "") for name in signed}
    # the query as sent (its own percent-encoding), less the signature
    rest = "&".join(
        p for p in request.query_string.decode().split("&") if not p.startswith("X-Amz-Signature=")
    )
    raw_path = request.environ.get("RAW_URI", request.path).split("?", 1)[0]
    aws = AWSRequest(
        method=request.method, url=f"http://{request.host}{raw_path}?{rest}", headers=headers
    )
    aws.context["timestamp"] = params["X-Amz-Date"]
    auth = S3SigV4QueryAuth(Credentials(access_key, SECRET_KEY), service, region, expires)
    expected = auth.signature(auth.string_to_sign(aws, auth.canonical_request(aws)), aws)
    if date != params["X-Amz-Date"][:8] or not hmac.compare_digest(
        expected, params["X-Amz-Signature"]
    ):
        return _error(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided",
        )
    return None


def gated(app: WsgiApp) -> WsgiApp:
    def gate(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        problem = refusal(Request(environ))
        if problem is not None:
            return problem(environ, start_response)
        return app(environ, start_response)

    return gate


def main() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, gated(app), threaded=True)


if __name__ == "__main__":
    main()
