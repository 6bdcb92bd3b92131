"""The `registryHostname` grammar: `host[:port]`, stored lower-cased (api.md §5).

A DNS name, an IPv4 literal or a bracketed IPv6 literal (`[::1]:5000`), optional port 1-65535;
no scheme, path, query, fragment or user info. A value with a scheme gets a message saying to
drop it. Used by the request models (validation) and by the pull look-ups (matching).
"""

from __future__ import annotations

import ipaddress
import re

from service.core.numbers import natural, natural_in
from service.core.validation import DNS_LABEL_RE
from service.registry.models import HOSTNAME_MAX

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]{0,15}$")


def split_host_port(raw: str) -> tuple[str, str | None]:
    """`host[:port]` → (host, port text or None), for a value that is known to be well formed."""
    if raw.startswith("["):
        end = raw.find("]")
        rest = raw[end + 1 :]
        return raw[: end + 1], (rest[1:] if rest.startswith(":") else None)
    if raw.count(":") == 1:
        host, port = raw.split(":")
        return host, port
    return raw, None


def _check_host(host: str) -> tuple[str | None, str | None]:
    """A lower-cased DNS name or IP literal (IPv6 in brackets) → (normalised, problem)."""
    if host.startswith("["):
        literal = host[1:-1]
        if "%" in literal:
            return None, "an IPv6 address must not carry a zone ('%...')"
        try:
            return f"[{ipaddress.IPv6Address(literal).compressed}]", None
        except ValueError:
            return None, f"'{host}' is not a valid IPv6 address"
    if not host:
        return None, "has no host name before the ':port'"
    if not host.isascii():
        return None, (
            "must be ASCII; write an internationalised domain name in its punycode ('xn--...') form"
        )
    host = host.lower()
    if host.endswith("."):
        return None, f"'{host}' must not end with '.'"
    labels = host.split(".")
    if all(label.isdigit() for label in labels):
        try:
            return str(ipaddress.IPv4Address(host)), None
        except ValueError:
            return None, f"'{host}' is not a valid IPv4 address"
    if len(host) > 253:
        return None, "a DNS name must be at most 253 characters"
    if any(not DNS_LABEL_RE.match(label) for label in labels):
        return None, (
            f"'{host}' is not a valid DNS name: each dot-separated label must be 1 to 63 "
            "letters, digits or '-', not starting or ending with '-'"
        )
    return host, None


def normalize_hostname(raw: str) -> tuple[str | None, list[str]]:
    """Check `host[:port]`; returns the lower-cased value or the problems found.

    Messages never repeat a value that holds user info (`user:password@host`).
    """
    if raw == "":
        return None, ["must not be empty"]
    if len(raw) > HOSTNAME_MAX:
        return None, [f"must be at most {HOSTNAME_MAX} characters"]
    if any(ch.isspace() or not ch.isprintable() for ch in raw):
        return None, ["must not contain spaces or control characters"]
    if "://" in raw:
        scheme, rest = raw.split("://", 1)
        shown = f"'{scheme}://'" if _SCHEME_RE.match(scheme) else "the scheme"
        message = f"must be host[:port] without a scheme: drop {shown}"
        hint = _suggestion(rest)
        if hint is not None:
            message += f" and send '{hint}'"
        return None, [message]
    if "@" in raw:
        return None, [
            "must not contain user info ('user:password@'); send the user name and password "
            "as secret.value, base64('user:password')"
        ]
    if any(sep in raw for sep in "/?#"):
        message = "must be host[:port] only, without a path, query or fragment"
        hint = _suggestion(raw)
        if hint is not None:
            message += f": send '{hint}'"
        return None, [message]

    port_text: str | None = None
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            return None, ["has an unclosed '[' (an IPv6 address is written '[::1]:5000')"]
        rest = raw[end + 1 :]
        if rest and not rest.startswith(":"):
            return None, ["must be '[ipv6]' or '[ipv6]:port', with nothing else after ']'"]
        host, port_text = raw[: end + 1], (rest[1:] if rest else None)
    elif raw.count(":") > 1:
        try:
            ip = ipaddress.IPv6Address(raw)
        except ValueError:
            return None, ["must be host[:port], with at most one ':'"]
        return None, [f"an IPv6 address must be in brackets: '[{ip.compressed}]'"]
    else:
        host, _, port = raw.partition(":")
        port_text = port if ":" in raw else None

    problems: list[str] = []
    normal, problem = _check_host(host)
    if problem is not None:
        problems.append(problem)
    port_number: int | None = None
    if port_text is not None:
        port_number = natural_in(port_text, 1, 65535)
        if port_number is None:
            shown = f", got {port_text}" if natural(port_text) is not None else ""
            problems.append(f"the port must be a number from 1 to 65535{shown}")
    if problems or normal is None:
        return None, problems
    return (normal if port_number is None else f"{normal}:{port_number}"), []


def _suggestion(rest: str) -> str | None:
    """The valid `host[:port]` at the start of a URL remainder, unless it has user info."""
    head = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in head or not head or "://" in head:
        return None
    normal, problems = normalize_hostname(head)
    return None if problems else normal
