"""Which servers the app's "Watch a server" tab may scrape. The scrape runs on the app's machine, so a URL is a
request from inside that machine's network: a deployment must not become a proxy into it. Three rules, strictest
first, each checked on every address the host resolves to (IPv4 and IPv6 alike; an IPv4 address mapped or embedded
in IPv6 is judged as the IPv4 address):

- public mode (specviz/policy.py: SPECVIZ_PUBLIC=1, the default on a Hugging Face Space): the host must be on the
  allow-list SPECVIZ_WATCH_HOSTS (comma-separated host names or addresses, matched without case; empty or unset: no
  host), and every address must be a public one: loopback, private, link-local, unspecified, multicast, reserved
  and shared (carrier-grade NAT) addresses are refused even when listed;
- exposed (the app listens beyond loopback: GRADIO_SERVER_NAME=0.0.0.0, ::, or any address other than 127.x/::1):
  public addresses are fetched; every other kind (loopback, private, link-local, ...) only when SPECVIZ_WATCH_HOSTS
  names the host or the address (e.g. SPECVIZ_WATCH_HOSTS=127.0.0.1 to watch a `serve` engine beside the app);
- local (the app listens on loopback only, the default): any address but a link-local one (169.254.0.0/16,
  fe80::/10: the cloud metadata service answers on 169.254.169.254) unless SPECVIZ_WATCH_HOSTS names it.

The tab checks before every scrape, and before any connection, so a name that starts resolving to a refused address
is refused from then on, and the scrape follows no redirect (serving/prometheus.py): a 3xx pointing at a refused
address is reported as the status it is. What is left: the HTTP client resolves the name again when it connects, so
a name whose DNS answer changes between the check and the connection (DNS rebinding) could slip through once.
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
LISTEN_ENV = "GRADIO_SERVER_NAME"  # where app.py listens (127.0.0.1 unless set)
LISTEN_DEFAULT = "127.0.0.1"
SCHEMES = ("http", "https")

Resolver = Callable[[str, int], list[str]]  # (host, port) -> the addresses it resolves to


class AccessError(ValueError):
    """A URL the tab may not fetch here; str() is one line naming the URL and what is accepted."""


@dataclass(frozen=True)
class Access:
    """What a deployment lets the tab fetch (read from the environment per call, like Policy)."""
    public: bool = False
    hosts: tuple[str, ...] = ()
    listen: str = LISTEN_DEFAULT   # the address the app listens on
    exposed: bool = False          # it listens beyond loopback: only public addresses unless allowed

    @classmethod
    def from_env(cls, resolver: Optional[Resolver] = None) -> "Access":
        raw = os.environ.get(HOSTS_ENV, "")
        listen = os.environ.get(LISTEN_ENV, "").strip() or LISTEN_DEFAULT
        return cls(public=Policy.from_env().public,
                   hosts=tuple(h.strip().lower().strip("[]") for h in raw.split(",") if h.strip()),
                   listen=listen, exposed=beyond_loopback(listen, resolver or resolve))

    def allows(self, host: str, address: str) -> bool:
        """Does SPECVIZ_WATCH_HOSTS name this host or this address?"""
        return host in self.hosts or address.split("%")[0].lower() in self.hosts


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo, TCP), as text."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def beyond_loopback(listen: str, resolver: Resolver = resolve) -> bool:
    """Does an app listening on `listen` (GRADIO_SERVER_NAME) answer beyond this machine? 0.0.0.0 and :: (every
    interface) do, as does any address but a loopback one; a name counts as loopback only if all it resolves to is
    (one that does not resolve counts as exposed)."""
    name = listen.strip().strip("[]").lower()
    if name in ("", "localhost"):
        return False
    try:
        return not ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        pass
    try:
        addresses = resolver(name, 0)
    except (OSError, UnicodeError):
        return True
    return not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


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


def check(url: str, access: Optional[Access] = None, resolver: Optional[Resolver] = None) -> str:
    """The URL, stripped, when the tab may fetch it here; else AccessError (one line naming the address and how to
    allow it). Resolves the host itself, so nothing connects to a refused address."""
    access = Access.from_env() if access is None else access
    resolver = resolve if resolver is None else resolver
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
    host = parts.hostname.lower()
    if access.public and host not in access.hosts:
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
        if reason is None:
            continue
        if access.public:
            raise AccessError(f"host {host!r} resolves to {address}, {reason}: a public deployment fetches public "
                              "addresses only")
        if access.allows(host, address):
            continue
        if "link-local" in reason:
            raise AccessError(f"host {host!r} resolves to {address}, {reason} (where cloud metadata services "
                              f"answer): refused; to allow it, add {host} to {HOSTS_ENV}")
        if access.exposed:
            raise AccessError(f"host {host!r} resolves to {address}, {reason}: this app listens beyond loopback "
                              f"({LISTEN_ENV}={access.listen}), so it fetches public addresses only; to allow this "
                              f"one, add {host} to {HOSTS_ENV}")
    return url
