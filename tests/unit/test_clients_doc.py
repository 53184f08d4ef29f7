"""docs/clients.md says what the code does: its settings tables are config.yaml's, and
its tensor, namespace and refusal facts are those of the wire layer and the IDL."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from devtools.local_cluster import REPO
from thrift_trainer.training.schema import OutputSettings, defaults
from thrift_trainer.wire import plaintext_refusal
from thrift_trainer.wire.tensor_codec import ALLOWED_DTYPES

sys.path.insert(0, str(REPO / "scripts"))
import gen_clients_doc  # noqa: E402 - a script, imported from scripts/

PAGE = (REPO / "docs" / "clients.md").read_text(encoding="utf-8")
CONFIG = (REPO / "config.yaml").read_text(encoding="utf-8")


def test_the_settings_tables_are_those_config_yaml_makes() -> None:
    assert gen_clients_doc.updated(PAGE, gen_clients_doc.render(CONFIG)) == PAGE, \
        "docs/clients.md is out of date: run python scripts/gen_clients_doc.py"


def test_every_key_of_config_yaml_has_a_row_with_its_default_and_comment() -> None:
    block = PAGE[PAGE.index(gen_clients_doc.BEGIN):PAGE.index(gen_clients_doc.END)]
    tables = re.split(r"^#### ", block, flags=re.MULTILINE)[1:]
    values = yaml.safe_load(CONFIG)
    assert [t.split("`")[1] for t in tables] == list(values)
    for table, (section, keys) in zip(tables, values.items(), strict=True):
        for key in keys:
            row = re.search(rf"^\| `{key}` \| `([^`]*)` \| (.+) \|$", table, re.MULTILINE)
            assert row, f"{section}.{key} has no row"
            # the column is JSON (YAML 1.1 would read 1e-05 as a string)
            assert json.loads(row.group(1)) == keys[key]
            assert len(row.group(2)) > 3, f"{section}.{key} has no description"


def test_a_comment_continued_on_the_next_line_is_kept_whole() -> None:
    sections = gen_clients_doc.read_sections(CONFIG)
    compression = next(s for s in sections if s.name == "compression")
    assert compression.keys["topk_fraction"].endswith("added to its next update")


@pytest.mark.parametrize("config, problem", [
    ("run:\n  algorithm: a  # what\n  colour: red  # new\noutputs:\n  x: 1  # y\n",
     "say where run.colour goes"),
    ("run: {algorithm: a}\noutputs:\n  x: 1  # y\n", "cannot read the comments"),
])
def test_a_key_the_page_could_not_describe_stops_the_generation(config: str,
                                                                problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        gen_clients_doc.render(config)


def test_outputs_json_takes_exactly_the_outputs_section() -> None:
    assert set(yaml.safe_load(CONFIG)["outputs"]) == set(defaults(OutputSettings))


def test_the_tensor_section_names_every_dtype_the_wire_carries() -> None:
    tensors = PAGE[PAGE.index("## Tensors"):PAGE.index("## `config_json`")]
    for dtype in ALLOWED_DTYPES:
        assert f"`{dtype}`" in tensors
    assert "little-endian" in tensors and "C order" in tensors


def test_the_namespaces_are_those_of_the_idl() -> None:
    idl = (REPO / "thrift" / "trainer.thrift").read_text(encoding="utf-8")
    namespaces = dict(re.findall(r"^namespace (\w+) (\S+)$", idl, re.MULTILINE))
    assert set(namespaces) == {"py", "java", "js", "go"}
    for language in ("py", "java", "js", "go"):
        assert f"| `{namespaces[language]}`" in PAGE


def test_the_page_quotes_the_tls_refusal() -> None:
    quoted = re.search(r"begins `([^`]+)`", PAGE).group(1)
    assert plaintext_refusal.MESSAGE.startswith(quoted)
