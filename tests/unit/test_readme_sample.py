"""The README's sample client output: it follows the README's own commands, and the shape
the end-to-end test compares keeps what the README promises (tests/e2e/test_readme_sample.py
runs the commands)."""

from __future__ import annotations

import sys

from devtools.local_cluster import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gen_readme_sample as sample  # noqa: E402 - a script, imported from scripts/

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_quick_start_is_the_assignment_run_on_idle_nodes():
    commands = sample.readme_commands(README)
    assert [load for _, load in commands.nodes] == ["0", "0"]  # real work: no simulated load
    assert commands.client == ["localhost", str(commands.coordinator_port), "letters", "5",
                               "15", "20", "0.0001"]
    # the nodes the quick start starts are the ones the repository's nodes file lists
    assert [port for port, _ in commands.nodes] == \
        [port for _, port in sample.nodes_file_entries()]


def test_the_sample_is_the_quick_start_client_and_its_deterministic_figures():
    block = sample.readme_block(README)
    assert block.splitlines()[1] == "$ " + sample.readme_commands(README).client_line()
    lines = sample.shape(sample.sample_output(block))
    assert lines[0] == "Final validation error: 0.7691"
    assert lines[1] == "Rounds: 5   Wall time: _ s   Run: <run>"
    assert lines[2].startswith("Bytes up: <size>  down: <size>  aggregation: mean")
    assert lines[3] == "Units: 55/55 done, rejected 0, failed 0, stale _, cancelled _"
    assert lines[4] == "Model saved to: models/<run>.npz"
    assert lines[5] == "Exported for torch: models/<run>.safetensors"
    assert lines[6] == "Run folder (on the coordinator): .../runs/<run>"
    assert ("┃ node ┃ state at end ┃ accepted ┃ rejected ┃ delayed ┃ failed ┃ cancelled ┃ "
            "samples ┃") in lines
    rows = [line for line in lines if line.startswith("│")]
    assert rows == ["│ <node> │ alive │ _ │ _ │ _ │ _ │ _ │ _ │"] * 2


OUTPUT = """\
Final validation error: 0.7691
Rounds: 5   Wall time: 0.8 s   Run: bf024e2d23db
Bytes up: 403.4 kB  down: 178.9 kB  aggregation: mean  compression: up none, down none
Units: 55/55 done, rejected 0, failed 0, stale 0, cancelled 0
Model saved to: models/bf024e2d23db.npz
Exported for torch: models/bf024e2d23db.safetensors
Run folder (on the coordinator): /tmp/tmpofk6hton/runs/bf024e2d23db
                Units per node
┏━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ node            ┃ state at end ┃ accepted ┃
┡━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ 127.0.0.1:42403 │ alive        │       28 │
└─────────────────┴──────────────┴──────────┘
"""


def test_the_shape_ignores_what_timing_decides():
    other = (OUTPUT.replace("0.8 s", "12.4 s").replace("bf024e2d23db", "0123456789ab")
             .replace("178.9 kB", "1.2 MB").replace("cancelled 0", "cancelled 3")
             .replace("/tmp/tmpofk6hton", "/home/me/thrift-trainer")
             .replace("│ 127.0.0.1:42403 │ alive        │       28 │",
                      "│ localhost:9091  │ alive        │      130 │")
             .replace("━━━━━━━━━━┓", "━━━━━━━━━━━┓"))
    assert sample.shape(other) == sample.shape(OUTPUT)


def test_the_shape_keeps_labels_figures_columns_and_states():
    for old, new in (("0.7691", "0.7692"), ("Rounds: 5", "Rounds: 6"), ("55/55", "54/55"),
                     ("rejected 0", "rejected 2"), ("Bytes up", "Bytes sent"),
                     ("aggregation: mean", "aggregation: median"),
                     ("state at end", "state"), ("│ alive ", "│ dead  "),
                     ("┃ accepted ┃", "┃ accepted ┃ images ┃"),
                     ("Model saved to", "Model at")):
        assert sample.shape(OUTPUT.replace(old, new)) != sample.shape(OUTPUT), old
    assert sample.shape(OUTPUT + "Samples: 64\n") != sample.shape(OUTPUT)
