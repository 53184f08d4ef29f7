"""The README's figures for the recommended configuration come from a measured run."""

from __future__ import annotations

import importlib.util
import json

from devtools.local_cluster import REPO

spec = importlib.util.spec_from_file_location("recommended", REPO / "bench" / "recommended.py")
recommended = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recommended)


def test_the_readme_paragraph_is_the_one_generated_from_the_saved_run():
    results = json.loads(recommended.RESULTS.read_text(encoding="utf-8"))
    assert len(results["history"]) == 10 and results["setup"]["nodes"] == 4
    assert recommended.readme_block() == recommended.readme_paragraph(results), (
        "README.md differs from bench/results/recommended.json: run "
        "python bench/recommended.py --readme-only")


def test_the_steady_round_is_the_first_after_which_the_error_stays_low():
    assert recommended.from_round([0.3, 0.09, 0.11, 0.08, 0.07]) == 4
    assert recommended.from_round([0.05, 0.06]) == 1
    assert recommended.from_round([0.05, 0.2]) is None
