"""Reading compute_nodes.txt: `host,port` per line; blank lines and `#` comments ignored."""

from __future__ import annotations

import os
from dataclasses import dataclass


class NodesFileError(ValueError):
    """compute_nodes.txt is missing, empty or malformed; the message names the line."""


@dataclass(frozen=True)
class NodeAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_nodes(text: str, source: str = "compute_nodes.txt") -> list[NodeAddress]:
    """Parse the file's text; duplicates are an error, since they would double a node's share."""
    nodes: list[NodeAddress] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        node = _parse_line(line, number, source)
        if node in nodes:
            raise NodesFileError(f"{source}, line {number}: {node} is listed twice")
        nodes.append(node)
    if not nodes:
        raise NodesFileError(
            f"{source} lists no compute node; "
            "add one 'host,port' line per node, e.g. localhost,9091"
        )
    return nodes


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
        raise NodesFileError(
            f"nodes file {path} not found; create it with one 'host,port' line per compute node"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NodesFileError(f"cannot read nodes file {path}: {exc}") from None
    return parse_nodes(text, source=str(path))
