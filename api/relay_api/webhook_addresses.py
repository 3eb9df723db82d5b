"""Where a webhook may be delivered: public addresses only, unless the operator allows others.

A webhook's URL is the user's to choose, and the worker that POSTs to it sits inside the
deployment's network, beside PostgreSQL, Redis, the cloud's metadata service (169.254.169.254)
and whatever else answers there. Delivering to any address would let a user make the service send
requests into that network (server-side request forgery). So, unless `webhook_private_addresses`
(RELAY_WEBHOOK_PRIVATE_ADDRESSES) is set, as `relay server` sets it on a laptop whose receivers are
its own:

- at create, a URL whose host is `localhost` or a literal non-public address is refused (400);
- at each delivery, the host is resolved, every address it resolves to must be public, and the
  request goes to the address that was checked (the URL's host still names it in the Host header
  and TLS's server name), so a name that resolves elsewhere a moment later (DNS rebinding) does not
  redirect it. Redirects are never followed (relay_worker.webhook_dispatch).
"""

from __future__ import annotations

import ipaddress
import socket

PRIVATE_RULE = (
    "must be a public address: loopback, private, link-local and other non-public addresses are "
    "refused (the operator allows them with RELAY_WEBHOOK_PRIVATE_ADDRESSES=true)"
)


class RefusedAddress(Exception):
    """A webhook host that is, or resolves to, a non-public address; the message says which."""


def is_public(address: str) -> bool:
    """Whether an IP address (text) is a public unicast one (an IPv4-mapped IPv6 address is judged
    by its IPv4 address)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is not global
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _literal(host: str) -> str | None:
    """The host as an IP address, if it is written as one."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def refusal_at_create(host: str) -> str | None:
    """Why a URL with this host is refused before any lookup (`localhost`, or a literal address
    that is not public), or None."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return f"{host} is a loopback name"
    literal = _literal(host)
    if literal is not None and not is_public(literal):
        return f"{host} is not a public address"
    return None


def public_address(host: str, port: int) -> str:
    """The address to deliver to: `host` resolved, every address it resolves to public (the first
    one's, IPv4 before IPv6). Raises RefusedAddress otherwise, or when it does not resolve."""
    refusal = refusal_at_create(host)
    if refusal is not None:
        raise RefusedAddress(f"refused: {refusal}")
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise RefusedAddress(f"{host} does not resolve: {error}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    private = [address for address in addresses if not is_public(address)]
    if not addresses or private:
        raise RefusedAddress(
            f"refused: {host} resolves to {', '.join(private) or 'nothing'}, not a public address"
        )
    addresses.sort(key=lambda address: ":" in address)  # IPv4 first
    return addresses[0]
