"""This host's IPv4 interfaces, and the one that routes to a given address (standard library only).

Used by the launcher (the addresses its monitor listens on, for ranks on any host to try) and by
``init_distributed`` (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, when the user did not set them, name the
interface that routes to the master address, instead of whatever the host's name resolves to).
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["ipv4_interfaces", "interface_to", "source_address_to"]

_SIOCGIFADDR = 0x8915


def ipv4_interfaces() -> list[tuple[str, str]]:
    """``[(name, address)]`` of every interface with an IPv4 address, loopback included, in index order."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            found.append((name, socket.inet_ntoa(packed[20:24])))
    return found


def source_address_to(address: str) -> str | None:
    """The local address the kernel would send from to reach ``address`` (a UDP connect sends nothing), or
    None when there is no route (or the name does not resolve)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def interface_to(address: str) -> tuple[str, str] | None:
    """``(interface name, its address)`` of the interface this host reaches ``address`` through, or None.

    The interface holding the route's source address: for the host's own address that is the interface
    with the address (the kernel sends it over loopback, but peers reach it on that interface)."""
    source = source_address_to(address)
    if source is None:
        return None
    for name, addr in ipv4_interfaces():
        if addr == source:
            return name, addr
    return None
