"""What the client prints: summaries, status and runs tables, progress lines."""

from __future__ import annotations

import io
import math
import re

import pytest
from rich.console import Console

from thrift_trainer.client import display
from thrift_trainer.wire.generated import ttypes


def rendered(renderable: object, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


NODE = {"node": "localhost:9091", "accepted": 3, "rejected": 1, "delayed": 0, "failed": 0,
        "cancelled": 0, "samples": 4500, "state": "alive", "pull": False}


def test_the_node_table_of_an_ended_run_labels_the_state_as_at_its_end() -> None:
    assert "state at end" in rendered(display.node_table([NODE], ended=True))
    running = rendered(display.node_table([NODE], ended=False))
    assert "state at end" not in running and "state" in running


def test_the_node_table_names_what_computes_a_node_s_units() -> None:
    relay = {**NODE, "node": "gw:9090", "role": "relay of 3 nodes"}
    table = rendered(display.node_table([NODE, relay], ended=False), width=120)
    assert "gw:9090 (relay of 3 nodes)" in table
    assert "localhost:9091 (" not in table  # a plain node computes its units itself


def test_the_node_table_shows_a_relay_s_members_under_it() -> None:
    inner = {**NODE, "node": "inner:9092", "role": "relay of 2 nodes", "accepted": 7,
             "members": [{**NODE, "node": "a:1", "accepted": 5}, {**NODE, "node": "b:2"}]}
    relay = {**NODE, "node": "gw:9090", "role": "relay of 2 nodes",
             "members": [inner, {**NODE, "node": "c:3"}]}
    lines = rendered(display.node_table([relay, NODE], ended=True), width=120).splitlines()
    cells = [line.split("│")[1] for line in lines if re.search(r"[a-z]+:\d", line)]
    assert [cell.strip() for cell in cells] == [
        "gw:9090 (relay of 2 nodes)", "└ inner:9092 (relay of 2 nodes)", "└ a:1", "└ b:2",
        "└ c:3", "localhost:9091"]
    depth = {cell.strip(): len(cell) - len(cell.lstrip()) for cell in cells}
    assert depth["└ a:1"] > depth["└ inner:9092 (relay of 2 nodes)"]  # a member of a member


def wire_summary(node: str, members: list[ttypes.NodeSummary] | None = None
                 ) -> ttypes.NodeSummary:
    return ttypes.NodeSummary(node=node, accepted=2, rejected=0, delayed=0, failed=0,
                              cancelled=0, busy_seconds=1.0, members=members)


def test_a_relay_s_members_reach_the_client_s_json_as_a_tree() -> None:
    tree = wire_summary("gw:1", [wire_summary("inner:2", [wire_summary("a:3")])])
    shown = display.node_dict(tree)
    assert shown["members"][0]["node"] == "inner:2"
    assert shown["members"][0]["members"][0]["node"] == "a:3"
    assert display.node_dict(wire_summary("plain:4"))["members"] == []


def result(model_json: str, scores: list[dict | None],
           error: float = 0.5) -> ttypes.RunResult:
    """A run's result; ``error``: each round's validation error (NaN: not evaluated)."""
    history = [ttypes.RoundMetrics(round=i + 1, validation_error=error, validation_loss=0.7,
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
    assert lines[0] == "IS 3.000  FID 40.25  FID (logits) 1.500  (round 3, 500 images)"
    assert lines[1].startswith("Discriminator probe error: 0.4812 (a progress signal")
    assert not any("validation error" in line for line in lines)
    assert data["latest_scores"]["round"] == 3


def test_a_gan_run_without_scores_says_why_and_the_mlp_keeps_its_headline() -> None:
    never_evaluated = result('{"model": "dcgan28", "gan": {}}', [None, None], math.nan)
    gan = display.headline(display.result_dict(never_evaluated, "m"))
    assert gan[0] == "IS and FID: not scored (outputs.eval_every is 0)"
    mlp = display.headline(display.result_dict(result('{"model": "mlp"}', [None]), "m"))
    assert mlp == ["Final validation error: 0.4812"]


def test_an_evaluated_gan_run_that_no_score_applies_to_does_not_blame_eval_every() -> None:
    """An image-folder run (64x64 colour images): evaluated every round, never scored."""
    image_folder = result('{"model": "dcgan64", "gan": {}}', [None, None])
    line = display.headline(display.result_dict(image_folder, "m"))[0]
    assert line.startswith("IS and FID: not scored") and "eval_every" not in line
    assert "28x28" in line


def status(round_index: int, **changes) -> ttypes.RunStatus:
    fields = dict(run_id="r", state="running", round=round_index, rounds=100,
                  validation_error=0.1234, units_done=1234, units_total=4000, rejected=123,
                  failed=4, in_flight=8, elapsed_seconds=75.0, nodes=[], epoch=12.5,
                  train_loss=0.5678, cancelled=345, stale=2)
    fields.update(changes)
    return ttypes.RunStatus(**fields)


def test_the_progress_line_shortens_then_drops_its_least_useful_fields_to_fit():
    fields = display.progress_fields(status(3))
    full = display.fit_line(fields, 1000)
    assert full.startswith("epoch 12.50  loss 0.5678  error 0.1234  units 1234/4000")
    short = display.fit_line(fields, len(full) - 1)
    assert short.startswith("ep 12.5  loss 0.568  err 0.1234  u 1234/4000  rej 123")
    narrow = display.fit_line(fields, 30)
    assert narrow == "err 0.1234  u 1234/4000  out 8" and len(narrow) <= 30
    assert display.fit_line([("x" * 50, "x" * 40, 0)], 10) == "x" * 9 + "…"


def visible_lines(text: str) -> list[str]:
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n")
    return [line for line in plain.splitlines() if line.strip()]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_live_progress_line_fits_the_terminal(width):
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    with display.ProgressView(quiet=False, console=console) as view:
        view.update(status(5, message="nodes warming up: 3 of 4 ready"))
        view.update(status(6))
    last = visible_lines(console.file.getvalue())[-1]
    assert last.startswith("round 6/100") and "err 0.1234" in last
    assert len(last) <= width


def test_progress_to_a_pipe_is_a_whole_line_per_round():
    console = Console(file=io.StringIO(), width=80, color_system=None)  # not a terminal
    with display.ProgressView(quiet=False, console=console) as view:
        for r in (0, 0, 1, 1, 1, 2):
            view.update(status(r))
    lines = console.file.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["round 0/100", "round 1/100",
                                                       "round 2/100"]
    assert all(line.endswith("stale 2  0:01:15") for line in lines)  # never cut at 80


REASON = ("deadline exceeded: no progress for 31.0s (10 x its unit time 3.1s), reclaimed "
          "and issued again on another node")
UNIT = {"round": 3, "unit": "train_letters7.txt", "status": "in_progress",
        "node": "localhost:9091", "age_seconds": 12.3, "attempts": 2, "failures": 1,
        "last_reason": REASON}


@pytest.mark.parametrize("width", [80, 120])
def test_unfinished_units_take_one_line_each_in_a_terminal(width):
    console = Console(file=io.StringIO(), width=width, color_system=None)
    for part in display.unfinished_view([UNIT, UNIT], width):
        console.print(part, no_wrap=True, overflow="ellipsis")
    lines = console.file.getvalue().splitlines()
    assert all(len(line) <= width for line in lines)
    assert sum("deadline exceeded" in line for line in lines) == 2  # one line per unit


def test_a_pipe_gets_every_column_whole():
    console = display.console_for(io.StringIO())
    assert console.width == display.WIDE
    for part in display.unfinished_view([UNIT], console.width):
        console.print(part, no_wrap=True, overflow="ellipsis")
    assert REASON in console.file.getvalue()


LAST_FAILURE = "unit train_letters3.txt on localhost:9092: ValueError: out of memory"


def test_discarded_units_show_in_the_progress_line_with_the_last_reason():
    quiet = display.fit_line(display.progress_fields(status(3)), 1000)
    assert "discarded" not in quiet  # a run that discards nothing prints as before
    fields = display.progress_fields(status(3, discarded=2, discard_reason=LAST_FAILURE))
    assert f"discarded 2 (last: {LAST_FAILURE})" in display.fit_line(fields, 1000)
    assert "disc 2" in display.fit_line(fields, 60)  # kept when the line must shrink


def test_the_summary_says_how_many_units_were_discarded_and_why(capsys):
    data = {"validation_error": 0.1, "rounds": 2, "wall_seconds": 1.0, "run_id": "r",
            "bytes_up": 0, "bytes_down": 0, "aggregation": "mean",
            "compression": display.NO_COMPRESSION, "model_path": "m.npz",
            "coordinator_run_dir": "runs/r", "nodes": [NODE],
            "units": display.unit_counts(status(2, discarded=1, discard_reason=LAST_FAILURE))}
    display.print_result(data, as_json=False)
    out = capsys.readouterr().out
    assert f"Units discarded 1 (last: {LAST_FAILURE}): each failed --max-unit-failures times" in out
    data["units"] = display.unit_counts(status(2))
    display.print_result(data, as_json=False)
    assert "discarded" not in capsys.readouterr().out


def metrics(index: int) -> ttypes.RoundMetrics:
    return ttypes.RoundMetrics(round=index, validation_error=0.5 - index / 100,
                               validation_loss=1.0, train_loss=2.0 - index / 10, seconds=0.01)


def test_a_pipe_gets_a_line_for_every_round_even_those_ended_between_two_polls():
    """Rounds shorter than the poll's interval: before, only the polled ones were said."""
    console = Console(file=io.StringIO(), width=80, color_system=None)  # not a terminal
    with display.ProgressView(quiet=False, console=console) as view:
        view.update(status(3, rounds=10, recent_rounds=[metrics(r) for r in (1, 2, 3)]))
        view.update(status(7, rounds=10, recent_rounds=[metrics(r) for r in range(4, 8)]))
        final = status(10, rounds=10, state="completed", recent_rounds=[metrics(10)])
        view.finish(ttypes.RunResult(run_id="r", validation_error=0.4, rounds=10,
                                     wall_seconds=1.0, history=[metrics(r) for r in range(1, 11)],
                                     nodes=[], weights=[], model_json="{}", run_dir="runs/r",
                                     final_status=final))
    lines = console.file.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        *(f"round {r}/10" for r in range(1, 10)), "round 10/10 completed"]
    assert lines[4] == "round 5/10  loss 1.5000  error 0.4500"


def test_stale_and_cancelled_attempts_are_explained_where_they_show(capsys):
    """A healthy K-of-N run: 'stale 50, cancelled 14' read as a fault, and `status` counted
    the same runs' units 'cancelled 60' without saying it counts units, not attempts."""
    kofn = status(30, rounds=30, state="completed", stale=50, cancelled=14,
                  ledger={"completed": 60, "cancelled": 60, "failed": 0})
    display.print_status(kofn, as_json=False)
    out = capsys.readouterr().out
    said = ("Attempts not used: stale 50 (results that came back too late), cancelled 14 "
            "(called off); a K-of-N round, which takes the first K results")
    assert said in out
    assert "units by status (each unit once): completed 60, cancelled 60" in out
    data = {"validation_error": 0.1, "rounds": 30, "wall_seconds": 1.0, "run_id": "r",
            "bytes_up": 0, "bytes_down": 0, "aggregation": "mean",
            "compression": display.NO_COMPRESSION, "model_path": "m.npz",
            "coordinator_run_dir": "runs/r", "nodes": [NODE], "units": display.unit_counts(kofn)}
    display.print_result(data, as_json=False)
    assert said in capsys.readouterr().out
    data["units"] = display.unit_counts(status(30, stale=0, cancelled=0))
    display.print_result(data, as_json=False)
    assert "Attempts not used" not in capsys.readouterr().out  # nothing to explain


def test_runs_shows_each_run_s_algorithm_and_model(capsys):
    display.print_runs([status(5, run_id="a1", algorithm="delta_avg", model="mlp"),
                        status(2, run_id="b2", algorithm="sync_sgd", model="dcgan28-tiny"),
                        status(1, run_id="c3")])  # a coordinator that sends neither
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["run", "state", "algorithm", "model"]
    assert lines[1].split()[:4] == ["a1", "running", "delta_avg", "mlp"]
    assert lines[2].split()[:4] == ["b2", "running", "sync_sgd", "dcgan28-tiny"]
    assert lines[3].split()[:4] == ["c3", "running", "-", "-"]
    assert display.status_dict(status(1, algorithm="sync_sgd", model="mlp"))["model"] == "mlp"
