"""Loopback only, without a key: where the service may listen, and which ``Host`` it answers.

A service started without an API key accepts any bearer token, so its only
protection is that nothing but this machine can reach it. Two rules keep it
so:

- :func:`is_loopback`: it binds only to an address that names this machine
  (``LocalTracesService`` refuses any other without a key).
- :func:`check_host`: it answers only requests whose ``Host`` header is a
  loopback name or literal, or the exact host it was bound to. Binding to
  loopback alone does not stop DNS rebinding: a page from another origin
  re-points its own name at 127.0.0.1, and the browser then sends that
  page's requests (with the page's name as ``Host``) here, and lets the page
  read the answers, since to the browser they come from the page's origin.
  Such a request is refused with 403 ``forbidden`` before it is routed.

With an API key the key is the protection and ``Host`` is not looked at: a
service behind a proxy or on a LAN name keeps working.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from prime_traces.errors import ErrorCode
from prime_traces.server._http import HTTPError

# RFC 9110 §7.2: Host = uri-host [ ":" port ]; an IPv6 literal is bracketed.
_HOST_RE = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[^:\[\]]+))(?::[0-9]{1,5})?")
_V6_LOOPBACK = ipaddress.IPv6Address("::1")
ACCEPTED_HOSTS = "localhost, *.localhost, 127.0.0.0/8 or [::1], with any port"
# An echoed Host is attacker-chosen text: keep the error message short.
_ECHO_CHARS = 100


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine."""
    if not host:  # every interface
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def host_is_local(value: str, bound_host: str) -> bool:
    """Whether the ``Host`` header ``value`` names this machine, or is ``bound_host`` (any port)."""
    match = _HOST_RE.fullmatch(value.strip().lower())
    if match is None:
        return False
    if match["v6"] is not None:
        try:
            # [::1] only: Python 3.13 counts an IPv4-mapped 127.0.0.1 as loopback too, 3.10-3.12 do not.
            return ipaddress.IPv6Address(match["v6"]) == _V6_LOOPBACK or match["v6"] == bound_host.lower()
        except ValueError:
            return False
    # A fully qualified "localhost." is the same name.
    name = match["name"].removesuffix(".")
    if name == "localhost" or name.endswith(".localhost") or name == bound_host.lower().removesuffix("."):
        return True
    try:
        return ipaddress.IPv4Address(name).is_loopback
    except ValueError:
        return False


def check_host(values: list[str], bound_host: str) -> None:
    """Refuse (403 ``forbidden``) a request without exactly one local ``Host`` header."""
    if len(values) == 1 and host_is_local(values[0], bound_host):
        return
    if not values:
        sent = "no Host header"
    elif len(values) > 1:
        sent = f"{len(values)} Host headers"
    else:
        shown = values[0] if len(values[0]) <= _ECHO_CHARS else values[0][:_ECHO_CHARS] + "..."
        sent = f"Host {shown!r}"
    literal = f"[{bound_host}]" if ":" in bound_host else bound_host
    bound = "" if host_is_local(literal, "") else f", or {bound_host!r} (the address it was bound to)"
    raise HTTPError(
        403,
        ErrorCode.FORBIDDEN,
        f"{sent} refused: a service without an API key answers only requests addressed to this machine "
        f"(a guard against DNS rebinding); the Host header must be {ACCEPTED_HOSTS}{bound}. "
        "Open the service by one of those names, or start it with --api-key",
    )
