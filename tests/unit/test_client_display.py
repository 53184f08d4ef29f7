"""What the client prints: summaries, status and runs tables, progress lines."""

from __future__ import annotations

import io

from rich.console import Console

from client import display
from wire.generated import ttypes


def rendered(renderable: object, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


NODE = {"node": "localhost:9091", "accepted": 3, "rejected": 1, "delayed": 0, "failed": 0,
        "cancelled": 0, "state": "alive", "pull": False}


def test_the_node_table_of_an_ended_run_labels_the_state_as_at_its_end() -> None:
    assert "state at end" in rendered(display.node_table([NODE], ended=True))
    running = rendered(display.node_table([NODE], ended=False))
    assert "state at end" not in running and "state" in running


def result(model_json: str, scores: list[dict | None]) -> ttypes.RunResult:
    history = [ttypes.RoundMetrics(round=i + 1, validation_error=0.5, validation_loss=0.7,
                                   train_loss=0.6, seconds=1.0, scores=s)
               for i, s in enumerate(scores)]
    return ttypes.RunResult(run_id="r", validation_error=0.4812, rounds=len(history),
                            wall_seconds=3.0, history=history, nodes=[], weights={},
                            model_json=model_json)


SCORES = {"inception_score": 2.5, "fid_features": 40.25, "fid_logits": 1.5, "n": 500}


def test_a_gan_summary_shows_its_latest_is_and_fid_and_names_the_probe() -> None:
    data = display.result_dict(result('{"model": "dcgan28", "gan": {}}',
                                      [SCORES, None, {**SCORES, "inception_score": 3.0}]), "m")
    lines = display.headline(data)
    assert lines[0] == "IS 3  FID 40.25  FID (logits) 1.5  (round 3, 500 images)"
    assert lines[1].startswith("Discriminator probe error: 0.4812 (a progress signal")
    assert not any("validation error" in line for line in lines)
    assert data["latest_scores"]["round"] == 3


def test_a_gan_run_without_scores_says_so_and_the_mlp_keeps_its_headline() -> None:
    gan = display.headline(display.result_dict(result('{"gan": {}}', [None]), "m"))
    assert gan[0] == "IS and FID: not scored (outputs.eval_every is 0)"
    mlp = display.headline(display.result_dict(result('{"model": "mlp"}', [None]), "m"))
    assert mlp == ["Final validation error: 0.4812"]
