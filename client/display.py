"""What the client prints: live progress on stderr, the final summary on stdout."""

from __future__ import annotations

import io
import json
import math
import sys
from collections.abc import Iterator
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from thrift_trainer.wire.generated import ttypes

WIDE = 100_000  # the width of a console that is not a terminal: nothing is cut or wrapped
ROUND_BAR = 16  # characters of the progress bar
ELAPSED = 7  # "0:00:12"
ELLIPSIS = "…"


def console_for(file: Any) -> Console:
    """A console on `file`: a terminal's own width, else wide enough never to cut a line
    (a pipe or a file gets every column of every row)."""
    console = Console(file=file)
    return console if console.is_terminal else Console(file=file, width=WIDE)


class ProgressView:
    """Progress fed with RunStatus snapshots on stderr: on a terminal a live bar whose
    line fits the terminal's width; otherwise one plain line per round (a log that a
    pipe or a file keeps whole); nothing in quiet mode."""

    def __init__(self, quiet: bool, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._quiet = quiet
        self._live = not quiet and self._console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        self._last_line = ""
        self._logged_round = 0  # the latest round a plain line was printed for
        self._told: set[str] = set()  # nodes whose leaving out was said
        if self._live:
            self._progress = Progress(
                TextColumn("{task.fields[head]}"),
                BarColumn(bar_width=ROUND_BAR),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=False,
            )

    def __enter__(self) -> ProgressView:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._progress.stop()

    def update(self, status: ttypes.RunStatus,
               history: list[ttypes.RoundMetrics] | None = None) -> None:
        """Show ``status``; ``history``: the metrics of rounds it may not carry (the
        result's, at the end)."""
        if self._quiet:
            return
        for line in left_out_lines([node_dict(n) for n in status.nodes or []], self._told):
            self.note(line)
        head = f"round {status.round}/{status.rounds}"
        if not self._live:
            self._log_rounds_between(status, history or [])
            self._log_line(head, status)
            return
        # the columns are separated by one space each; the rest of the line is the detail's
        room = self._console.width - len(head) - ROUND_BAR - ELAPSED - 3
        detail = fit_line(progress_fields(status), room)
        if self._task is None:  # started on the first status, so early errors print alone
            self._progress.start()
            self._task = self._progress.add_task("train", total=status.rounds, head=head,
                                                 detail=detail)
        self._progress.update(self._task, completed=status.round, head=head, detail=detail)

    def finish(self, result: ttypes.RunResult) -> None:
        """The run's end as the result tells it: the rounds that ended after the last poll
        and the final counts."""
        if result.final_status is not None:
            self.update(result.final_status, result.history)

    def _log_rounds_between(self, status: ttypes.RunStatus,
                            history: list[ttypes.RoundMetrics]) -> None:
        """A line for each round that ended between two polls (rounds may take less than
        the poll's interval), from the metrics the status carries: the log keeps one line
        per round. A round neither carries (a resumed run's earlier rounds) is skipped."""
        metrics = {m.round: m for m in [*(status.recent_rounds or []), *history]}
        for index in range(self._logged_round + 1, status.round):
            if index in metrics:
                self._console.print(round_line(metrics[index], status.rounds),
                                    soft_wrap=True, highlight=False)
        self._logged_round = max(self._logged_round, status.round)

    def _log_line(self, head: str, status: ttypes.RunStatus) -> None:
        """One line when the round, the state or the message changes (not every poll)."""
        key = f"{head} {status.state} {status.message or ''}"
        if key == self._last_line:
            return
        self._last_line = key
        if status.state != "running":
            head = f"{head} {status.state}"
        detail = "  ".join(full for full, _, _ in progress_fields(status))
        self._console.print(f"{head}  {detail}  {_clock(status.elapsed_seconds)}",
                            soft_wrap=True, highlight=False)

    def note(self, message: str) -> None:
        if not self._quiet:
            self._console.print(message, soft_wrap=True)


def round_line(m: ttypes.RoundMetrics, rounds: int) -> str:
    """A round that ended between two polls: its loss and error (the unit counts of that
    moment are gone)."""
    parts = [f"round {m.round}/{rounds}"]
    if not math.isnan(m.train_loss):
        parts.append(f"loss {m.train_loss:.4f}")
    if not math.isnan(m.validation_error):
        parts.append(f"error {m.validation_error:.4f}")
    return "  ".join(parts)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


# A field of the progress line: (full text, short text, priority: the largest goes first
# when the line must shrink).
Field = tuple[str, str, int]


def progress_fields(s: ttypes.RunStatus) -> list[Field]:
    """The progress line's fields in display order: a waiting message, metrics when
    known, then unit counts (cancelled and stale only when any)."""
    fields: list[Field | None] = [
        (s.message, s.message, 0) if s.state == "running" and s.message else None,
        (f"epoch {s.epoch:.2f}", f"ep {s.epoch:.1f}", 6) if s.epoch is not None else None,
        (f"{s.mode} v{s.model_version} pass {s.pass_index}",
         f"v{s.model_version} p{s.pass_index}", 6)
        if s.model_version is not None and s.mode != "sync" else None,
        (f"loss {s.train_loss:.4f}", f"loss {s.train_loss:.3f}", 4)
        if s.train_loss is not None else None,
        (f"error {s.validation_error:.4f}", f"err {s.validation_error:.4f}", 1)
        if s.validation_error >= 0 else None,
        (f"units {s.units_done}/{s.units_total}", f"u {s.units_done}/{s.units_total}", 2),
        (f"rejected {s.rejected}", f"rej {s.rejected}", 7),
        (f"failed {s.failed}", f"fail {s.failed}", 5),
        (f"out {s.in_flight}", f"out {s.in_flight}", 3),
        (f"cancelled {s.cancelled}", f"canc {s.cancelled}", 8) if s.cancelled else None,
        (f"stale {s.stale}", f"stale {s.stale}", 9) if s.stale else None,
        (discarded_text(s.discarded, s.discard_reason), f"disc {s.discarded}", 1)
        if s.discarded else None,
    ]
    return [f for f in fields if f is not None]


def discarded_text(count: int, reason: str | None) -> str:
    """E.g. 'discarded 2 (last: unit r3-u1 on 10.0.0.7:9091: out of memory)': units given
    up after too many failures, whose rounds went on without them."""
    return f"discarded {count}" + (f" (last: {reason})" if reason else "")


def fit_line(fields: list[Field], width: int, sep: str = "  ") -> str:
    """The fields in at most `width` characters: full texts if they fit, else short ones,
    else without the least important fields; a lone field too long is cut with an
    ellipsis."""
    for texts in ([f[0] for f in fields], [f[1] for f in fields]):
        line = sep.join(texts)
        if len(line) <= width:
            return line
    kept = list(fields)
    while len(kept) > 1 and len(sep.join(f[1] for f in kept)) > width:
        kept.remove(max(kept, key=lambda f: f[2]))
    line = sep.join(f[1] for f in kept)
    return line if len(line) <= width else line[:max(0, width - 1)] + ELLIPSIS


def _progress_parts(s: ttypes.RunStatus) -> list[str]:
    """The progress fields' full texts, for the status line."""
    return [full for full, _, _ in progress_fields(s)]


def result_dict(result: ttypes.RunResult, model_path: str,
                export_path: str | None = None) -> dict[str, Any]:
    """The final result as plain data, for --json and for the summary; ``export_path``:
    the model as safetensors, written beside ``model_path``."""
    return {
        "run_id": result.run_id,
        "validation_error": result.validation_error,
        "rounds": result.rounds,
        "wall_seconds": round(result.wall_seconds, 3),
        "model_path": model_path,
        "export": export_path,
        "coordinator_run_dir": result.run_dir,
        "history": [{"round": m.round, "validation_error": m.validation_error,
                     "validation_loss": m.validation_loss, "train_loss": m.train_loss,
                     "seconds": round(m.seconds, 3),
                     "update_seconds": round(m.update_seconds or 0.0, 4),
                     **(m.scores or {})}
                    for m in result.history],
        "nodes": [node_dict(n) for n in result.nodes],
        "bytes_up": result.bytes_up or 0,
        "bytes_down": result.bytes_down or 0,
        "aggregation": result.aggregation or "mean",
        "compression": json.loads(result.compression_json or "{}") or NO_COMPRESSION,
        "gan": "gan" in json.loads(result.model_json or "{}"),
        "latest_scores": latest_scores(result.history),
        "units": unit_counts(result.final_status),
    }


def latest_scores(history: list[ttypes.RoundMetrics]) -> dict[str, float] | None:
    """The last round's offline scores (IS, FID) with its round number, or None."""
    scored = [m for m in history if m.scores]
    if not scored:
        return None
    return {"round": scored[-1].round, **scored[-1].scores}


def unit_counts(s: ttypes.RunStatus | None) -> dict[str, Any]:
    """The run's unit counts at its end, as `status` reports them (an older coordinator
    sends none)."""
    if s is None:
        return {}
    return {"done": s.units_done, "total": s.units_total, "rejected": s.rejected,
            "failed": s.failed, "stale": s.stale or 0, "cancelled": s.cancelled or 0,
            "ledger": dict(s.ledger or {}),
            **({"discarded": s.discarded, "discard_reason": s.discard_reason}
               if s.discarded else {})}


def units_line(units: dict[str, Any]) -> str:
    """E.g. 'Units: 110/110 done, rejected 3, failed 1, stale 0, cancelled 2'."""
    return (f"Units: {units['done']}/{units['total']} done, rejected {units['rejected']}, "
            f"failed {units['failed']}, stale {units['stale']}, cancelled {units['cancelled']}")


def unused_line(stale: int, cancelled: int) -> str | None:
    """What the stale and cancelled counts are, where they show (None when both are 0):
    attempts, not units, and on a healthy K-of-N run or with backups, no problem."""
    if not stale and not cancelled:
        return None
    return (f"Attempts not used: stale {stale} (results that came back too late), cancelled "
            f"{cancelled} (called off); a K-of-N round, which takes the first K results, "
            "and backups leave these on a healthy run: rejected, failed, stale and "
            "cancelled count attempts, done counts each unit once")


def discarded_line(units: dict[str, Any]) -> str:
    """The summary's line for units given up: how many, the last one's failure, and why
    the run went on."""
    return (f"Units {discarded_text(units['discarded'], units.get('discard_reason'))}: "
            "each failed --max-unit-failures times; their rounds went on without them")


NO_COMPRESSION = {"up": "none", "down": "none"}


def transfer_line(data: dict[str, Any]) -> str:
    """Bytes moved and how: e.g. 'Bytes up: 1.2 MB  down: 8.4 MB  aggregation: mean
    compression: up topk 0.01, down none'."""
    comp = data["compression"]
    up = comp["up"]
    if up == "topk":
        warmup = comp.get("topk_warmup_rounds", 0)  # absent from runs recorded before it
        up += f" {comp['topk_fraction']:g}" + (f" (warm-up {warmup})" if warmup else "")
    return (f"Bytes up: {_size(data['bytes_up'])}  down: {_size(data['bytes_down'])}  "
            f"aggregation: {data['aggregation']}  compression: up {up}, down {comp['down']}")


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def node_dict(n: ttypes.NodeSummary) -> dict[str, Any]:
    return {"node": n.node, "accepted": n.accepted, "rejected": n.rejected,
            "delayed": n.delayed, "failed": n.failed, "cancelled": n.cancelled,
            "samples": n.samples or 0, "busy_seconds": round(n.busy_seconds, 3),
            "compute_seconds": round(n.compute_seconds or 0.0, 3),
            "delay_seconds": round(n.delay_seconds or 0.0, 3),
            "state": n.state or "alive", "pull": bool(n.pull), "role": n.role,
            "note": n.note, "refused": n.refused,
            "members": [node_dict(m) for m in n.members or []]}


def left_out_lines(nodes: list[dict[str, Any]], told: set[str] | None = None) -> list[str]:
    """One line per node that the run does without, and why (skipping those in ``told``,
    which it then holds)."""
    told = set() if told is None else told
    lines = [f"node {n['node']} is left out: {n['note']}" for n in nodes
             if n.get("note") and n["node"] not in told]
    told.update(n["node"] for n in nodes if n.get("note"))
    return lines


def refused_lines(nodes: list[dict[str, Any]]) -> list[str]:
    """One line per node, a relay's members included, whose result was refused (the node
    was benched for it), with the reason of the last one."""
    return [f"node {n['node']} was benched for a result refused: {n['refused']}"
            for n, _ in _tree(nodes) if n.get("refused")]


def print_result(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console = console_for(sys.stdout)
    for line in headline(data):
        console.print(line, soft_wrap=True)
    console.print(f"Rounds: {data['rounds']}   Wall time: {data['wall_seconds']:.1f} s   "
                  f"Run: {data['run_id']}")
    console.print(transfer_line(data), soft_wrap=True)  # one line, however narrow
    if data["units"]:
        console.print(units_line(data["units"]), soft_wrap=True)
        unused = unused_line(data["units"]["stale"], data["units"]["cancelled"])
        if unused:
            console.print(unused, soft_wrap=True, highlight=False)
    if data["units"].get("discarded"):
        console.print(discarded_line(data["units"]), soft_wrap=True, highlight=False)
    console.print(f"Model saved to: {data['model_path']}")
    if data.get("export"):
        console.print(f"Exported for torch: {data['export']}")
    console.print(f"Run folder (on the coordinator): {data['coordinator_run_dir']}")
    console.print(node_table(data["nodes"], ended=True))
    for line in left_out_lines(data["nodes"]) + refused_lines(data["nodes"]):
        console.print(line, soft_wrap=True)


SCORE_LABELS = (("inception_score", "IS", ".3f"), ("fid_features", "FID", ".2f"),
                ("fid_logits", "FID (logits)", ".3f"))
PROBE_NOTE = "(a progress signal: about 0.5 when it cannot tell real from generated)"


def headline(data: dict[str, Any]) -> list[str]:
    """The result's first lines: the MLP's validation error; for a GAN its latest IS and
    FID, and the discriminator's probe error under its own name."""
    if not data.get("gan"):
        return [f"Final validation error: {data['validation_error']:.4f}",
                *client_lines(data.get("latest_scores"))]
    scores = data.get("latest_scores")
    if scores:
        n = f", {scores['n']:.0f} images" if "n" in scores else ""
        parts = [f"{label} {scores[key]:{form}}" for key, label, form in SCORE_LABELS
                 if key in scores]
        quality = "  ".join(parts) + f"  (round {scores['round']}{n})"
    elif _evaluated(data):  # the run scores what it can when it evaluates
        quality = "IS and FID: not scored (they score generators of 28x28 MNIST images only)"
    else:
        quality = "IS and FID: not scored (outputs.eval_every is 0)"
    return [quality,
            f"Discriminator probe error: {data['validation_error']:.4f} {PROBE_NOTE}"]


def client_lines(scores: dict[str, float] | None) -> list[str]:
    """A run with federated clients: its last round's clients and the spread of their
    training losses (coordinator/client_files.py's fairness figures), and its latest
    federated evaluation (coordinator/client_eval.py); a private run's epsilon spent."""
    if not scores:
        return []
    lines = privacy_lines(scores)
    if "client_loss_mean" not in scores:
        return lines
    return [f"Clients (round {scores['round']:.0f}): {scores['clients_trained']:.0f} "
            f"trained, training loss mean {scores['client_loss_mean']:.4f}, worst 10% "
            f"{scores['client_loss_worst10']:.4f}, spread (std) "
            f"{scores['client_loss_std']:.4f}", *federated_lines(scores), *lines]


def privacy_lines(scores: dict[str, float]) -> list[str]:
    """A private run (docs/privacy.md): the epsilon spent after the round, and the clip the
    round used when it adapts."""
    if "epsilon" not in scores:
        return []
    clip = f", clip {scores['clip']:.4g}" if "clip" in scores else ""
    return [f"Privacy (round {scores['round']:.0f}): epsilon {scores['epsilon']:.4g} "
            f"spent{clip}"]


def federated_lines(scores: dict[str, float]) -> list[str]:
    """The latest federated evaluation: size-weighted figures over the clients scored on
    their own validation parts, and the spread of their accuracy (or metric)."""
    if "federated_val_loss" not in scores:
        return []
    name, label = ("val_accuracy", "accuracy") if "federated_val_accuracy" in scores \
        else ("val_error", "error")
    missed = scores.get("clients_eval_missed", 0)
    return [f"Federated evaluation (round {scores.get('eval_round', scores['round']):.0f}): "
            f"{scores['clients_evaluated']:.0f} clients"
            + (f" ({missed:.0f} missed)" if missed else "")
            + f", validation {label} {scores['federated_' + name]:.4f} (weighted by "
            f"examples), loss {scores['federated_val_loss']:.4f}; per client mean "
            f"{scores['client_' + name + '_mean']:.4f}, worst 10% "
            f"{scores['client_' + name + '_worst10']:.4f}, spread (std) "
            f"{scores['client_' + name + '_std']:.4f}"]


def _evaluated(data: dict[str, Any]) -> bool:
    """Whether any round of the run was evaluated (outputs.eval_every above 0)."""
    return any(not math.isnan(r["validation_error"]) for r in data["history"])


def node_table(nodes: list[dict[str, Any]], ended: bool) -> Table:
    """Counts per node; the state of an ended run's nodes is the one they had at its end
    (the coordinator stops watching them then), and the column says so."""
    table = Table(title="Units per node")
    table.add_column("node")
    table.add_column("state at end" if ended else "state")
    for column in COUNTS:
        table.add_column(column, justify="right")
    for n, depth in _tree(nodes):
        state = n.get("state", "alive") + (" (pull)" if n.get("pull") else "")
        name = n["node"] + (f" ({n['role']})" if n.get("role") else "")  # a relay, workers
        table.add_row("  " * (depth - 1) + "└ " * (depth > 0) + name, state,
                      *(str(n[c]) for c in COUNTS))
    return table


# samples: rows or images of the units a node completed
COUNTS = ("accepted", "rejected", "delayed", "failed", "cancelled", "samples")


def _tree(nodes: list[dict[str, Any]], depth: int = 0) -> Iterator[tuple[dict[str, Any], int]]:
    """Each node, then a relay's members under it (their counts are the relay's own, over
    its life), with their depth in the tree."""
    for n in nodes:
        yield n, depth
        yield from _tree(n.get("members") or [], depth + 1)


def status_dict(s: ttypes.RunStatus) -> dict[str, Any]:
    return {"run_id": s.run_id, "state": s.state, "algorithm": s.algorithm, "model": s.model,
            "round": s.round, "rounds": s.rounds,
            # -1 on the wire means "not measured yet": null in JSON
            "validation_error": s.validation_error if s.validation_error >= 0 else None,
            "units_done": s.units_done,
            "units_total": s.units_total, "rejected": s.rejected, "failed": s.failed,
            "in_flight": s.in_flight, "elapsed_seconds": round(s.elapsed_seconds, 3),
            "stale": s.stale, "cancelled": s.cancelled, "epoch": s.epoch,
            "train_loss": s.train_loss, "mode": s.mode or "sync", **stream_dict(s),
            **({"leader": s.leader} if s.leader is not None else {}),
            **({"clients": dict(s.clients)} if s.clients else {}),
            "message": s.message, "nodes": [node_dict(n) for n in s.nodes],
            "ledger": dict(s.ledger or {}),
            "unfinished": [{"round": u.round, "unit": u.unit_id, "status": u.status,
                            "node": u.node, "age_seconds": round(u.age_seconds, 1),
                            "attempts": u.attempts, "failures": u.failures,
                            "last_reason": u.last_reason} for u in s.unfinished or []]}


def stream_dict(s: ttypes.RunStatus) -> dict[str, Any]:
    """The version and pass with its todo / pending / done units, of a run that draws
    units from passes over the data."""
    if s.pass_index is None:
        return {}
    return {"model_version": s.model_version, "pass": s.pass_index,
            "todo": s.todo, "pending": s.pending, "done": s.done}


def print_status(s: ttypes.RunStatus, as_json: bool) -> None:
    data = status_dict(s)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console = console_for(sys.stdout)
    console.print(f"Run {s.run_id}: {s.state}, round {s.round}/{s.rounds}, "
                  f"{s.elapsed_seconds:.1f} s; " + ", ".join(p for p in _progress_parts(s) if p))
    if s.message and s.state != "running":  # a running run's message is in the line above
        console.print(f"  {s.message}")
    if s.leader is not None:  # coordinators sharing a PostgreSQL store
        console.print(f"  leader: {s.leader or 'none yet'}")
    if s.pass_index is not None:
        console.print(f"  {s.mode}: model version {s.model_version}, pass {s.pass_index}: "
                      f"todo {s.todo}, pending {s.pending}, done {s.done}")
    for line in client_lines({"round": s.round, **s.clients} if s.clients else None):
        console.print(f"  {line}")
    unused = unused_line(s.stale or 0, s.cancelled or 0)
    if unused:
        console.print(f"  {unused}", soft_wrap=True, highlight=False)
    if data["ledger"]:
        counts = ", ".join(f"{k} {v}" for k, v in data["ledger"].items() if v)
        # units, where the line above counts attempts: a K-of-N round's units it did not
        # need are "cancelled" here however their attempts ended
        console.print(f"  units by status (each unit once): {counts}", soft_wrap=True,
                      highlight=False)
    console.print(node_table(data["nodes"], ended=s.state != "running"))
    for line in left_out_lines(data["nodes"]):
        console.print(line, soft_wrap=True)
    if data["unfinished"]:
        for part in unfinished_view(data["unfinished"], console.width):
            console.print(part, no_wrap=True, overflow="ellipsis")


RUNS_COLUMNS = ("run", "state", "algorithm", "model", "round", "error", "units", "seconds",
                "message")


def print_runs(runs: list[ttypes.RunStatus]) -> None:
    """One line per run (`runs --nodes` shows each as `status` does)."""
    table = Table(box=None, pad_edge=False, show_edge=False)
    for column in RUNS_COLUMNS:
        table.add_column(column, no_wrap=True, overflow="ellipsis",
                         justify="right" if column in ("error", "seconds") else "left")
    for s in runs:
        table.add_row(s.run_id, s.state, s.algorithm or "-", s.model or "-",
                      f"{s.round}/{s.rounds}",
                      f"{s.validation_error:.4f}" if s.validation_error >= 0 else "-",
                      f"{s.units_done}/{s.units_total}", f"{s.elapsed_seconds:.1f}",
                      s.message or "")
    console_for(sys.stdout).print(table, no_wrap=True, overflow="ellipsis")


UNFINISHED_COLUMNS = ("round", "unit", "status", "node", "age s", "tries", "fails")
MIN_REASON = 24  # narrower than this, reasons go on lines of their own under the table


def unfinished_view(units: list[dict[str, Any]], width: int = WIDE) -> list[Table | Text]:
    """The unfinished units, one line each: the last reason gets what the other columns
    leave of `width` and is cut with an ellipsis beyond it (a pipe gets it whole); when
    too little is left, the reasons follow the table, one line per unit."""
    rows = [[str(u["round"]), u["unit"], u["status"], u["node"] or "-",
             f"{u['age_seconds']:.1f}", str(u["attempts"]), str(u["failures"])]
            for u in units]
    reasons = [u["last_reason"] or "" for u in units]
    room = width - _width_of(_unit_table(rows)) - 2  # the reason column's padding
    if room >= MIN_REASON:
        return [_unit_table(rows, reasons, room)]
    lines = [Text(f"{u['round']} {u['unit']}: {reason}", no_wrap=True, overflow="ellipsis")
             for u, reason in zip(units, reasons, strict=True) if reason]
    return [_unit_table(rows), *lines]


def _unit_table(rows: list[list[str]], reasons: list[str] | None = None,
                reason_width: int = 0) -> Table:
    table = Table(title="Unfinished units", box=box.SIMPLE_HEAD, show_edge=False,
                  collapse_padding=True, pad_edge=False)
    for column in UNFINISHED_COLUMNS:
        table.add_column(column, no_wrap=True)
    if reasons is not None:
        table.add_column("last reason", no_wrap=True, overflow="ellipsis",
                         max_width=reason_width)
    for i, row in enumerate(rows):
        table.add_row(*row, *([] if reasons is None else [reasons[i]]))
    return table


def _width_of(table: Table) -> int:
    """The width `table` takes at its natural size."""
    console = Console(file=io.StringIO(), width=WIDE)
    return console.measure(table).maximum
