"""The README's quick start, run as written: its three commands on 127.0.0.1, and the
client's output against the sample the README shows (scripts/gen_readme_sample.py)."""

from __future__ import annotations

import sys

from devtools.local_cluster import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gen_readme_sample as sample  # noqa: E402 - a script, imported from scripts/

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_commands_print_the_readme_sample(tmp_path):
    commands = sample.readme_commands(README)
    done, ports = sample.run(commands, tmp_path)
    assert done.returncode == 0, done.stderr
    output = sample.render(done.stdout, tmp_path, ports, sample.nodes_file_entries())
    shown = sample.sample_output(sample.readme_block(README))
    assert sample.shape(output) == sample.shape(shown), (
        "README.md's sample output differs from what its commands print: run "
        "python scripts/gen_readme_sample.py\n" + output)
