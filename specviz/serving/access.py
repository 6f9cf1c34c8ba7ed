"""Which servers the app's "Watch a server" tab may scrape. Outside public mode any http(s) URL. In public mode
(specviz/policy.py: SPECVIZ_PUBLIC=1, the default on a Hugging Face Space) a public Space must not become a proxy
into anyone's network, so a URL is refused unless

- its host is on the allow-list SPECVIZ_WATCH_HOSTS (comma-separated host names or addresses, matched without
  case; empty or unset: no host is allowed), and
- every address the host resolves to is a public one: loopback, private, link-local, unspecified, multicast,
  reserved and shared (carrier-grade NAT) addresses are always refused, IPv4 and IPv6 alike (an IPv4 address
  mapped or embedded in IPv6 is judged as the IPv4 address).

The tab checks before every scrape, so a name that starts resolving to a private address is refused from then on,
and the scrape follows no redirect (serving/prometheus.py). What is left: the HTTP client resolves the name again when
it connects, so a name whose DNS answer changes between the check and the connection (DNS rebinding) could slip
through once; the allow-list confines that to hosts the operator chose.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Callable, Optional
from urllib.parse import urlsplit

from specviz.policy import Policy

HOSTS_ENV = "SPECVIZ_WATCH_HOSTS"
SCHEMES = ("http", "https")

Resolver = Callable[[str, int], list[str]]  # (host, port) -> the addresses it resolves to


class AccessError(ValueError):
    """A URL the tab may not fetch here; str() is one line naming the URL and what is accepted."""


@dataclass(frozen=True)
class Access:
    """What a deployment lets the tab fetch (read from the environment per call, like Policy)."""
    public: bool = False
    hosts: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> "Access":
        raw = os.environ.get(HOSTS_ENV, "")
        return cls(public=Policy.from_env().public,
                   hosts=tuple(h.strip().lower().strip("[]") for h in raw.split(",") if h.strip()))


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo, TCP), as text."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def why_not_public(address: str) -> Optional[str]:
    """None when `address` is a public (globally routable) one, else what it is."""
    ip = ipaddress.ip_address(address.split("%")[0])  # an IPv6 scope id (fe80::1%eth0) says nothing here
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            reason = why_not_public(str(embedded))
            return f"{reason} (inside the IPv6 address {ip})" if reason else None
        if ip in ipaddress.IPv6Network("64:ff9b::/96"):  # NAT64: the IPv4 address is the last 32 bits
            reason = why_not_public(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
            return f"{reason} (inside the IPv6 address {ip})" if reason else None
    for kind in ("loopback", "unspecified", "link_local", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return f"a {kind.replace('_', '-')} address"
    if not ip.is_global:
        return "not a public address"
    return None


def check(url: str, access: Optional[Access] = None, resolver: Resolver = resolve) -> str:
    """The URL, stripped, when the tab may fetch it here; else AccessError (one line)."""
    access = Access.from_env() if access is None else access
    url = str(url or "").strip()
    if not url:
        raise AccessError("the server URL is empty: give e.g. http://HOST:8000 (the server's /metrics is scraped)")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise AccessError(f"url={url!r} is not a URL ({exc}): give e.g. http://HOST:8000") from None
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise AccessError(f"url={url!r} is not an http(s) URL with a host: give e.g. http://HOST:8000")
    if parts.username or parts.password:
        raise AccessError(f"url={parts.hostname!r} carries credentials: give the URL without user:password@")
    if not access.public:
        return url
    host = parts.hostname.lower()
    if host not in access.hosts:
        allowed = ", ".join(access.hosts) if access.hosts else f"none (the operator sets {HOSTS_ENV})"
        raise AccessError(f"host {host!r} is not on this deployment's allow-list: allowed hosts are {allowed}")
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError) as exc:
        raise AccessError(f"host {host!r} does not resolve ({exc.__class__.__name__})") from None
    if not addresses:
        raise AccessError(f"host {host!r} resolves to no address")
    for address in addresses:
        reason = why_not_public(address)
        if reason:
            raise AccessError(f"host {host!r} resolves to {address}, {reason}: a public deployment fetches public "
                              "addresses only")
    return url
