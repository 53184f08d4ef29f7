"""Reading compute_nodes.txt: `host,port` per line; blank lines and `#` comments ignored.

The coordinator reads the file before every round (`NodesFile`), so reading is linear in
its lines and skipped while the file is unchanged; the coordinator's own address is
refused and aliases of one node (`localhost`, `127.0.0.1`) are kept once, with a warning.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.local_host import LOCAL, WILDCARDS, canonical_host

log = logging.getLogger("coordinator.nodes")


class NodesFileError(ValueError):
    """compute_nodes.txt is missing, empty or malformed; the message names the line."""


class NoNodesListed(NodesFileError):
    """The file is missing or lists no node: a coordinator then serves only the nodes that
    register with it."""


@dataclass(frozen=True)
class NodeAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_nodes(text: str, source: str = "compute_nodes.txt") -> list[NodeAddress]:
    """Parse the file's text; duplicates are an error, since they would double a node's share."""
    nodes: dict[NodeAddress, int] = {}  # a dict, not a list: `in` stays O(1) per line
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        node = _parse_line(line, number, source)
        if node in nodes:
            raise NodesFileError(f"{source}, line {number}: {node} is listed twice")
        nodes[node] = number
    if not nodes:
        raise NoNodesListed(
            f"{source} lists no compute node; "
            "add one 'host,port' line per node, e.g. localhost,9091"
        )
    return list(nodes)


def _parse_line(line: str, number: int, source: str) -> NodeAddress:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 2 or not parts[0]:
        raise NodesFileError(
            f"{source}, line {number}: expected 'host,port', got {line!r}"
        )
    host, port_text = parts
    try:
        port = int(port_text)
    except ValueError:
        raise NodesFileError(
            f"{source}, line {number}: port {port_text!r} is not a number"
        ) from None
    if not 0 < port < 65536:
        raise NodesFileError(f"{source}, line {number}: port {port} is outside 1..65535")
    return NodeAddress(host, port)


def read_nodes_file(path: str | os.PathLike) -> list[NodeAddress]:
    """Read and parse the nodes file, with an error that names the path when it is missing."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise NoNodesListed(
            f"nodes file {path} not found; create it with one 'host,port' line per compute node"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NodesFileError(f"cannot read nodes file {path}: {exc}") from None
    return parse_nodes(text, source=str(path))


class NodesFile:
    """The nodes file of a coordinator, parsed again only when it changed on disk.

    `serve_at` tells it the coordinator's own address once bound: a line naming it would
    make the coordinator call itself as a compute node, so the file is refused.
    """

    def __init__(self, path: str | os.PathLike, role: str = "coordinator") -> None:
        """``role``: what reads the file, for messages ("coordinator", "relay")."""
        self.path = Path(path)
        self.role = role
        self._own: tuple[str, int] | None = None
        self._lock = runtime.Lock()
        self._signature: tuple[int, ...] | None = None
        self._nodes: list[NodeAddress] = []
        self._error: NodesFileError | None = None

    def serve_at(self, host: str, port: int) -> None:
        """The coordinator listens on host:port (host may be a wildcard such as 0.0.0.0)."""
        with self._lock:
            self._own = ("" if host in WILDCARDS else host, port)
            self._signature = None  # check the file against the address at the next read

    def read(self) -> list[NodeAddress]:
        """The file's nodes, aliases of one node kept once; NodesFileError if unusable."""
        with self._lock:
            signature = self._stat()
            if signature is None or signature != self._signature:
                self._signature = signature
                try:
                    self._nodes, self._error = self._parse(), None
                except NodesFileError as exc:
                    self._nodes, self._error = [], exc
            if self._error is not None:
                raise self._error
            return list(self._nodes)

    def _stat(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None  # missing: read (and report) it every time, it may appear
        return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev

    def _parse(self) -> list[NodeAddress]:
        nodes = read_nodes_file(self.path)
        bound_host = self._own[0] if self._own else ""
        kept: dict[tuple[str, int], NodeAddress] = {}
        aliases: list[str] = []
        for node in nodes:
            key = (canonical_host(node.host, bound_host), node.port)
            if self._own is not None and key == (LOCAL, self._own[1]):
                raise NodesFileError(
                    f"{self.path}: {node} is this {self.role}'s own address; list the "
                    f"compute nodes' addresses, not the {self.role}'s")
            if key in kept:
                aliases.append(f"{node} (same as {kept[key]})")
            else:
                kept[key] = node
        if aliases:  # one line per change of the file, however many aliases it has
            log.warning("%s: %d lines name a node listed before; each node is used once: %s%s",
                        self.path, len(aliases), ", ".join(aliases[:5]),
                        ", ..." if len(aliases) > 5 else "")
        return list(kept.values())
