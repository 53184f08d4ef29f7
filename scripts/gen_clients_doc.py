#!/usr/bin/env python3
"""Writes the table of run settings in docs/clients.md from config.yaml.

config.yaml lists every key of a run with its default and a comment; clients in other
languages send those keys as JSON (`config_json`, `outputs_json`). The page's table is
made from the file, between two marker lines, so it cannot drift from it; a unit test
fails when the page differs from what this script writes.

Usage: python scripts/gen_clients_doc.py [--check]   (--check: exit 1 if the page differs)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from thrift_trainer.training.run_config import (  # noqa: E402
    AGGREGATION,
    CLIENTS,
    COMPRESSION,
    DATA,
    HIERARCHY,
    OUTPUTS,
    PRIVACY,
    RUN,
    SCHEDULE,
)

CONFIG = ROOT / "config.yaml"
PAGE = ROOT / "docs" / "clients.md"
BEGIN = "<!-- BEGIN run settings: written by scripts/gen_clients_doc.py from config.yaml -->"
END = "<!-- END run settings -->"

# Where each key of the `run` section goes; a key missing here fails the generation, so a
# new one cannot go undocumented.
RUN_KEYS = {
    "algorithm": "`algorithm` (and it picks the section sent as `config_json`)",
    "model": "`model`",
    "model_args": "`model.args` of `config_json`",
    "loss": "`model.loss` of `config_json`",
    "metric": "`model.metric` of `config_json`",
    "init_weights": "`model.init_weights` of `config_json`",
    "lr_schedule": "`model.lr_schedule` of `config_json`",
    "warmup_steps": "`model.warmup_steps` of `config_json`",
    "lr_rounds": "`model.lr_rounds` of `config_json`",
    "lr_end": "`model.lr_end` of `config_json`",
    "lr_step_every": "`model.lr_step_every` of `config_json`",
    "lr_step_gamma": "`model.lr_step_gamma` of `config_json`",
    "server_lr_schedule": "`model.server_lr_schedule` of `config_json`",
    "server_warmup_rounds": "`model.server_warmup_rounds` of `config_json`",
    "clip_norm": "`model.clip_norm` of `config_json`",
    "precision": "`model.precision` of `config_json`",
    "dataset": "`dataset`",
    "algorithm_args": "a plug-in algorithm's `config_json` itself",
    "rounds": "`rounds`",
    "seed": "none: send it as the `seed` key of `config_json`",
    "deterministic": "none: the coordinator's `--deterministic` flag decides",
}

_SECTION = re.compile(r"^(\w+):\s*(?:#\s*(.*))?$")
_KEY = re.compile(r"^\s+(\w+):[^#]*(?:#\s*(.*))?$")
_MORE = re.compile(r"^\s+#\s*(.*)$")


@dataclass
class Section:
    name: str
    comment: str
    keys: dict[str, str] = field(default_factory=dict)  # key -> its comment


def read_sections(text: str) -> list[Section]:
    """Sections and keys of config.yaml in file order, each with its comment; an indented
    comment line continues the comment of the key above it."""
    sections: list[Section] = []
    last_key = None
    for line in text.splitlines():
        if match := _SECTION.match(line):
            sections.append(Section(match.group(1), match.group(2) or ""))
            last_key = None
        elif sections and (match := _MORE.match(line)) and last_key:
            keys = sections[-1].keys
            keys[last_key] = f"{keys[last_key]} {match.group(1)}".strip()
        elif sections and (match := _KEY.match(line)):
            last_key = match.group(1)
            sections[-1].keys[last_key] = match.group(2) or ""
    return sections


def destination(section: str) -> str:
    """What a section becomes in a TrainRequest."""
    if section == RUN:
        return "the request's own fields"
    if section == OUTPUTS:
        return "the object sent as `outputs_json`"
    if section == AGGREGATION:
        return "sent inside `config_json` as the object under `\"aggregation\"`"
    if section == COMPRESSION:
        return ("sent inside `config_json` as the object under `\"compression\"`, only when "
                "`up` or `down` is not `none`")
    if section == SCHEDULE:
        return ("sent inside `config_json` as the object under `\"schedule\"`, only when "
                "`mode` is not `sync` or `prefetch` is not 0")
    if section == HIERARCHY:
        return ("sent inside `config_json` as the object under `\"hierarchy\"`, only when "
                "`relay_local_rounds` is not 1")
    if section == CLIENTS:
        return ("sent inside `config_json` as the object under `\"clients\"`, only when "
                "`count` is not 0")
    if section == PRIVACY:
        return ("sent inside `config_json` as the object under `\"privacy\"`, only when "
                "a key is not its default (privacy is on when `clip` is above 0)")
    if section == DATA:
        return ("sent inside `config_json` as the object under `\"data\"`, holding the keys "
                "that differ from their defaults (torch models only)")
    return f"the object sent as `config_json` when `run.algorithm` is `{section}`"


def render(text: str) -> str:
    """The generated part of the page: one table per section of config.yaml `text`."""
    values = yaml.safe_load(text)
    sections = read_sections(text)
    unread = set(values) ^ {section.name for section in sections}
    if unread:
        raise ValueError(f"config.yaml: cannot read the comments of sections {sorted(unread)}")
    parts = []
    for section in sections:
        unread = set(values[section.name]) ^ set(section.keys)
        if unread:
            raise ValueError(f"config.yaml: cannot read the comments of {sorted(unread)}")
        parts.append(_table(section, values[section.name]))
    return "\n\n".join(parts)


def _table(section: Section, values: dict[str, Any]) -> str:
    rows = [f"#### `{section.name}`: {destination(section.name)}", ""]
    if section.comment:
        rows += [_sentence(section.comment), ""]
    run = section.name == RUN
    rows += ["| key | default (JSON) | meaning |" + (" TrainRequest field |" if run else ""),
             "| --- | --- | --- |" + (" --- |" if run else "")]
    for key, comment in section.keys.items():
        row = f"| `{key}` | `{json.dumps(values[key])}` | {_cell(comment)} |"
        if run:
            if key not in RUN_KEYS:
                raise ValueError(f"scripts/gen_clients_doc.py: say where run.{key} goes "
                                 "(RUN_KEYS)")
            row += f" {RUN_KEYS[key]} |"
        rows.append(row)
    return "\n".join(rows)


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}."


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def updated(page: str, block: str) -> str:
    """`page` with the text between its marker lines replaced by `block`."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{PAGE.name} lacks the marker lines {BEGIN!r} ... {END!r}")
    return f"{page[:start]}{BEGIN}\n\n{block}\n\n{page[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page differs from config.yaml, writing nothing")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    new = updated(page, render(CONFIG.read_text(encoding="utf-8")))
    if args.check:
        if new != page:
            print(f"{PAGE} is out of date: run scripts/gen_clients_doc.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
