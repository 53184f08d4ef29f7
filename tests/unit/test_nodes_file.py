"""compute_nodes.txt parsing: comments, blanks, and errors that name the line."""

from __future__ import annotations

import pytest

from coordinator.nodes_file import NodeAddress, NodesFileError, parse_nodes, read_nodes_file


def test_comments_and_blank_lines_are_ignored():
    text = "# lab machines\n\nlocalhost,9091\n  host-b , 9092  # second\n"
    assert parse_nodes(text) == [NodeAddress("localhost", 9091), NodeAddress("host-b", 9092)]


@pytest.mark.parametrize("text, message", [
    ("localhost,9091\nlocalhost:9092\n", "line 2: expected 'host,port'"),
    ("localhost,abc\n", "line 1: port 'abc' is not a number"),
    ("localhost,70000\n", "line 1: port 70000 is outside"),
    (",9091\n", "line 1: expected 'host,port'"),
    ("a,1\nb,2\na,1\n", "line 3: a:1 is listed twice"),
    ("\n# nothing\n", "lists no compute node"),
])
def test_malformed_files_name_the_line(text, message):
    with pytest.raises(NodesFileError, match=message):
        parse_nodes(text, source="nodes.txt")


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(NodesFileError, match="nodes.txt not found"):
        read_nodes_file(tmp_path / "nodes.txt")
