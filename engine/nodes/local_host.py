"""Which host names and addresses mean this machine, so that aliases of one node
(`localhost`, `127.0.0.1`, `LOCALHOST`, this machine's name) are recognised as one.

No DNS lookups per name: a nodes file of thousands of lines is read before every round.
Only this machine's own name is resolved, once per process.
"""

from __future__ import annotations

import functools
import ipaddress
import socket

LOCAL = "<this machine>"  # the canonical host of every name for this machine
WILDCARDS = ("", "0.0.0.0", "::")


@functools.lru_cache(maxsize=1)
def _machine_names() -> frozenset[str]:
    """This machine's host name, its short form and the addresses /etc/hosts gives it."""
    name = socket.gethostname().lower()
    names = {"localhost", "localhost.localdomain", name, name.split(".", 1)[0]}
    try:
        _, aliases, addresses = socket.gethostbyname_ex(name)
    except OSError:  # an unresolvable own name: the names above are all we know
        return frozenset(names)
    return frozenset(names | {a.lower() for a in aliases} | set(addresses))


def canonical_host(host: str, bound_host: str = "") -> str:
    """`host` as one spelling per machine: LOCAL for this machine, else lower case
    without a trailing dot (host names are case-insensitive)."""
    name = host.strip().lower().rstrip(".").strip("[]")
    if name in _machine_names() or (bound_host and name == bound_host.lower()):
        return LOCAL
    try:
        if ipaddress.ip_address(name).is_loopback:
            return LOCAL
    except ValueError:
        pass
    return name
