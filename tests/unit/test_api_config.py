"""A run configuration given as a dict (thrift_trainer.Coordinator.train): merged over
config.yaml's defaults exactly as a recipe file is, and refused with the same lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from thrift_trainer.api import RoundInfo, _RoundWatcher, _run_config
from thrift_trainer.training.run_config import RunConfigError, load_run_config
from thrift_trainer.wire.generated import ttypes

RECIPE = """\
run:
  model: mlp_classifier
  rounds: 3
delta_avg:
  eta: 0.01
  hidden: [64, 32]
data:
  format: letters
"""
SAME_AS_DICT = {"run": {"model": "mlp_classifier", "rounds": 3},
                "delta_avg": {"eta": 0.01, "hidden": [64, 32]}, "data": {"format": "letters"}}


def test_a_dict_merges_over_the_defaults_as_the_same_recipe_file_does(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    from_dict = _run_config(SAME_AS_DICT)
    assert from_dict.to_dict() == load_run_config(recipe, []).to_dict()
    assert from_dict.to_dict() == _run_config(str(recipe)).to_dict()  # a path works too
    assert from_dict.rounds == 3 and from_dict.model == "mlp_classifier"
    assert from_dict.section("delta_avg")["server_lr"] == 1.0  # untouched: the default
    assert from_dict.section("delta_avg")["seed"] == 1  # null: inherited from run.seed


def test_set_overrides_apply_after_the_dict() -> None:
    config = load_run_config(None, ["run.rounds=7"], sections=SAME_AS_DICT)
    assert config.rounds == 7


@pytest.mark.parametrize(("config", "message"), [
    ({"run": {"roundz": 2}},
     "unknown key 'run.roundz' (in the configuration dict); did you mean 'run.rounds'"),
    ({"delta_avg": {"eta": "fast"}}, "(in the configuration dict)"),
    ({"runs": {"rounds": 2}}, "unknown key 'runs' (in the configuration dict)"),
    ({"run": 3}, "run must be a section of keys"),
    ([("run", {})], "the configuration dict: expected sections such as {'run': {...}}, "
                    "got a list"),
    ({"run": {"model": "mlp"}, "data": {"format": "csv"}}, "data.format is for torch models"),
])
def test_a_bad_dict_is_refused_in_one_line_naming_the_key(config: object, message: str) -> None:
    with pytest.raises(RunConfigError) as caught:
        _run_config(config)  # type: ignore[arg-type]
    assert message in str(caught.value) and "\n" not in str(caught.value)


def status(round_number: int, error: float, loss: float | None) -> ttypes.RunStatus:
    return ttypes.RunStatus(run_id="r", state="running", round=round_number, rounds=4,
                            validation_error=error, units_done=0, units_total=8, rejected=0,
                            failed=0, in_flight=0, elapsed_seconds=1.5, nodes=[],
                            train_loss=loss)


def test_every_round_is_reported_once_in_order_even_when_a_poll_misses_one() -> None:
    seen: list[RoundInfo] = []
    watcher = _RoundWatcher("r", seen.append)
    for s in (status(0, -1.0, None), status(1, 0.5, 2.0), status(1, 0.5, 2.0),
              status(3, 0.3, 1.0)):
        watcher.update(s)
    history = [{"round": n, "validation_error": e, "train_loss": 0.1, "seconds": 1.0}
               for n, e in ((1, 0.5), (2, 0.4), (3, 0.3), (4, 0.2))]
    watcher.finish(history, 4)
    assert [(r.round, r.validation_error) for r in seen] == [
        (1, 0.5), (2, None), (3, 0.3), (4, 0.2)]  # round 2 ended between two polls
    assert seen[-1].elapsed_seconds == 4.0 and seen[0].train_loss == 2.0


def test_a_callback_that_raises_is_kept_and_interrupts_the_following() -> None:
    def fail(info: RoundInfo) -> None:
        raise ArithmeticError(f"round {info.round}")

    watcher = _RoundWatcher("r", fail)
    with pytest.raises(KeyboardInterrupt):  # so that the client cancels the run first
        watcher.update(status(1, 0.5, 2.0))
    assert isinstance(watcher.failure, ArithmeticError) and str(watcher.failure) == "round 1"
