"""Which Host (and, from browsers, Origin) a request may name: the defence against DNS rebinding.

A web page whose hostname the attacker re-points at 127.0.0.1 can send same-origin requests to a
local sidecar and read the replies (with auth off, the default, nothing else stops it). Such a
request always names the attacker's domain in its Host header, never an IP address; so a request
is served only if its Host is an IP literal, a loopback name (``localhost``, ``*.localhost``),
the address the sidecar is bound to, this machine's own names when it listens on every address,
or a name in ``--allowed-hosts``. A browser's ``Origin``, when sent, must name such a host too
(``http``/``https`` only). Anything else: 403 in the route's error envelope.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp import web

from sidecar.errors import APIError

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")


class HostRule:
    """``allows(host)``: whether a Host header's name (port stripped) may be served."""

    def __init__(self, allowed: str = "", bound: str = "127.0.0.1"):
        entries = [e.strip().lower().rstrip(".") for e in allowed.replace(",", " ").split() if e.strip()]
        self.any = "*" in entries
        self.suffixes = tuple(e for e in entries if e.startswith("."))  # ".example.com": it and its subdomains
        self.names = {e for e in entries if not e.startswith(".")} | set(LOOPBACK_NAMES)
        bound = bound.strip().lower().strip("[]")
        if bound in WILDCARD_ADDRESSES:
            self.names |= _own_names()
        elif bound:
            self.names.add(bound)

    def allows(self, host: str) -> bool:
        if self.any:
            return True
        name = _name_of(host)
        if name is None:
            return False
        if _is_ip(name) or name in self.names or name.endswith(".localhost"):
            return True
        return any(name == s[1:] or name.endswith(s) for s in self.suffixes)

    def allows_origin(self, origin: str) -> bool:
        if self.any:
            return True
        try:
            parts = urlsplit(origin)
            host = parts.hostname
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and host is not None and self.allows(host)


def _name_of(host: str) -> str | None:
    """The name of a Host header (``name``, ``name:port``, ``[v6]:port``), lower case; None if malformed."""
    host = host.strip().lower()
    if not host:
        return None
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else None
    if host.count(":") == 1:
        host, _, port = host.partition(":")
        if port and not port.isdigit():
            return None
    elif host.count(":") > 1:  # a bare IPv6 address (not valid in Host, but unambiguous)
        return host if _is_ip(host) else None
    return host.rstrip(".") or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _own_names() -> set[str]:
    names = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names.add(name.lower())
    return names


def host_not_allowed(what: str) -> APIError:
    return APIError(
        403,
        f"{what} is not allowed on this sidecar (a page re-pointing its hostname at it?); "
        "serve it with --allowed-hosts NAME to accept that name",
        type="permission_error",
        code="host_not_allowed",
    )


def host_middleware(rule: HostRule):
    """403 unless the request's Host, and its Origin if it has one, name an allowed host."""

    @web.middleware
    async def check_host(request: web.Request, handler):
        host = request.headers.get("Host", "")
        if not rule.allows(host):
            raise host_not_allowed(f"Host {host[:100]!r}")
        origin = request.headers.get("Origin")
        if origin is not None and not rule.allows_origin(origin):
            raise host_not_allowed(f"Origin {origin[:100]!r}")
        return await handler(request)

    return check_host
