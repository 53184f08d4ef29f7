"""Where a PostgreSQL run store is (`--store`), as libpq reads it, and how it is shown.

A location is any URL libpq accepts (postgresql:// or postgres://, several hosts with a port
each, query parameters) or libpq's key=value form (`host=db dbname=trainer user=trainer`).
libpq itself parses it (psycopg's conninfo_to_dict), so whatever it accepts works and what
it refuses is said in one line. A password may sit in the user info, in the query
(`?password=`), in the key=value form or in PGPASSWORD: messages and logs show the location
rebuilt from libpq's parameters with the password left out (`***`), never the text as
given, and any text of libpq's that could quote one is scrubbed of it.
"""

from __future__ import annotations

import contextlib
import os
import re
from urllib.parse import quote, unquote

from thrift_trainer.engine.ledger import RunStoreError

SCHEMES = ("postgresql://", "postgres://")
HIDDEN = "***"
_KEY_VALUE = re.compile(r"\s*[A-Za-z_]+\s*=")  # the key=value form starts "host=..."
# passwords as typed, found without libpq (whose refusal may quote them): in the user info
# (which ends at the first @ or /, as libpq reads it), and as a parameter, quoted or not
_USER_INFO_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@/:]*:([^@/]*)@")
_PASSWORD_PARAMETER = re.compile(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^&\s]*))")


def is_postgres_url(location: str) -> bool:
    """Whether ``--store`` names a PostgreSQL store (else it is an SQLite file's path)."""
    return location.startswith(SCHEMES) or _KEY_VALUE.match(location) is not None


def parameters(location: str) -> dict[str, str]:
    """libpq's parameters of ``location``; RunStoreError, naming no password, when libpq
    refuses it."""
    import psycopg  # here: a coordinator that asks only is_postgres_url starts without it

    try:
        return psycopg.conninfo.conninfo_to_dict(location)
    except psycopg.ProgrammingError as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else "not understood"
        raise RunStoreError(f"the run store location is not one libpq accepts: "
                            f"{without_passwords(said, location)}") from None


def redacted(location: str) -> str:
    """The location without its password, for messages and logs: rebuilt from libpq's
    parameters, in the form it was given in."""
    import psycopg

    try:
        given = psycopg.conninfo.conninfo_to_dict(location)
    except psycopg.ProgrammingError:
        return "(a location libpq refuses)"
    if not location.startswith(SCHEMES):
        return psycopg.conninfo.make_conninfo(
            "", **{key: HIDDEN if key == "password" else value for key, value in given.items()})
    return _url(location.split("://", 1)[0], given)


def without_passwords(text: str, location: str) -> str:
    """``text`` (libpq's words about ``location``) with every password it may hold hidden."""
    for secret in sorted(_passwords(location), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text


def _passwords(location: str) -> set[str]:
    """Every password ``location`` and the environment hold, as typed and as decoded."""
    import psycopg

    found = set(_USER_INFO_PASSWORD.findall(location))
    found |= {quoted or bare for quoted, bare in _PASSWORD_PARAMETER.findall(location)}
    found |= {unquote(secret) for secret in found}
    with contextlib.suppress(psycopg.ProgrammingError):  # then the expressions found all
        found.add(psycopg.conninfo.conninfo_to_dict(location).get("password", ""))
    found.add(os.environ.get("PGPASSWORD", ""))
    return {secret for secret in found if secret}


def _url(scheme: str, given: dict[str, str]) -> str:
    rest = dict(given)
    user, password = rest.pop("user", None), rest.pop("password", None)
    dbname = rest.pop("dbname", None)
    auth = ""
    if user is not None:
        auth = quote(user, safe="") + (f":{HIDDEN}" if password is not None else "") + "@"
    elif password is not None:
        rest["password"] = HIDDEN
    hosts = _hosts(rest.pop("host", ""), rest.pop("port", ""), rest)
    path = "/" + quote(dbname, safe="") if dbname is not None else ""
    query = "&".join(f"{quote(key)}={quote(value, safe='*')}" for key, value in rest.items())
    return f"{scheme}://{auth}{hosts}{path}" + (f"?{query}" if query else "")


def _hosts(hosts: str, ports: str, rest: dict[str, str]) -> str:
    """The URL's host list, each host with its port (libpq: one port for all, or one each);
    lists that do not pair up go to the query, as libpq took them."""
    host_list, port_list = hosts.split(",") if hosts else [], ports.split(",") if ports else []
    if len(port_list) == 1 and len(host_list) > 1:
        port_list *= len(host_list)
    if not host_list or len(port_list) not in (0, len(host_list)):
        rest.update({key: value for key, value in (("host", hosts), ("port", ports)) if value})
        return ""
    port_list = port_list or [""] * len(host_list)
    return ",".join(_host(host) + (f":{port}" if port else "")
                    for host, port in zip(host_list, port_list, strict=True))


def _host(host: str) -> str:
    if ":" in host and "/" not in host:  # an IPv6 address
        return f"[{host}]"
    return quote(host, safe="")
