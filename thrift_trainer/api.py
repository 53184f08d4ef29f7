"""Training from Python (a notebook, a script): a coordinator's address, a configuration
as a dict, a callback per round, and the result with its model back::

    import thrift_trainer as tt

    coordinator = tt.Coordinator("trainer.example.org", 9095)
    result = coordinator.train({"run": {"model": "mlp_classifier", "rounds": 3}},
                               on_round=lambda r: print(r.round, r.validation_error))
    model = result.module()  # the trained torch nn.Module

The configuration is merged over config.yaml's defaults exactly as ``client.py --config``
merges a recipe (training/run_config.py), and the run is followed as the client follows it
(client/session.py); a local cluster to train on is cluster.py's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrift_trainer.results import TrainingResult

POLL_SECONDS = 0.25  # between status calls while a run trains
DEAD_AFTER_SECONDS = 15.0  # a coordinator silent this long: the run is given up
INTERRUPTED = (130, 143)  # the client's exit codes for Ctrl-C and SIGTERM


class TrainingError(RuntimeError):
    """A run that did not complete (it failed, was cancelled or refused, or the coordinator
    could not be reached); the message is the line ``client.py`` prints."""


@dataclass(frozen=True)
class RoundInfo:
    """A finished round, as ``on_round`` receives it, once per round and in order.

    ``validation_error`` and ``train_loss`` are None for a round that ended between two
    looks at the run's progress (every round's figures are in ``TrainingResult.history``);
    ``elapsed_seconds``: since the run started.
    """

    run_id: str
    round: int
    rounds: int
    validation_error: float | None
    train_loss: float | None
    elapsed_seconds: float


class _CallbackFailed(KeyboardInterrupt):
    """``on_round`` raised: raised in its place, as an interrupt, so that the client
    cancels the run and waits for its end (client/session.py) before the callback's own
    exception is raised again."""


class _RoundWatcher:
    """What the client's progress view is given (statuses and notes), turned into one
    RoundInfo per round for ``on_round``."""

    def __init__(self, run_id: str, on_round: Callable[[RoundInfo], None] | None) -> None:
        self.run_id = run_id
        self.on_round = on_round
        self.reported = 0
        self.failure: Exception | None = None  # what on_round raised

    def update(self, status: Any) -> None:
        for number in range(self.reported + 1, status.round + 1):
            latest = number == status.round
            error = status.validation_error if latest and status.validation_error >= 0 \
                else None
            self._report(RoundInfo(self.run_id, number, status.rounds, error,
                                   status.train_loss if latest else None,
                                   status.elapsed_seconds))

    def finish(self, history: Sequence[dict[str, Any]], rounds: int) -> None:
        """The rounds the last look missed (the last one, usually), from the result."""
        elapsed = 0.0
        for row in history:
            elapsed += row["seconds"]
            if row["round"] > self.reported:
                self._report(RoundInfo(self.run_id, row["round"], rounds,
                                       row["validation_error"], row["train_loss"], elapsed))

    def _report(self, info: RoundInfo) -> None:
        self.reported = info.round
        if self.on_round is None:
            return
        try:
            self.on_round(info)
        except Exception as exc:
            self.failure = exc
            raise _CallbackFailed from exc

    def note(self, message: str) -> None:
        print(message, file=sys.stderr)  # rare: the coordinator changed, a node left out


class Coordinator:
    """A coordinator at ``host``:``port``. ``token``: the shared token, when it requires
    one (default: $TRAINER_TOKEN); ``tls_ca``: its CA certificate, when it serves TLS;
    ``plugins`` / ``plugin_dir``: modules of your own that the trained models come from,
    allowed in this process by ``TrainingResult.module()``."""

    def __init__(self, host: str, port: int, *, token: str | None = None,
                 tls_ca: str | os.PathLike | None = None, plugins: Sequence[str] = (),
                 plugin_dir: str | os.PathLike | None = None,
                 connect_timeout: float = 5.0) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be a number from 1 to 65535, got {port!r}")
        self.host = host
        self.port = port
        self.token = token
        self.tls_ca = tls_ca
        self.plugins = list(plugins)
        self.plugin_dir = plugin_dir
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"Coordinator({self.host!r}, {self.port})"

    def train(self, config: dict[str, Any] | str | os.PathLike,
              on_round: Callable[[RoundInfo], None] | None = None,
              run_id: str | None = None, *, out: str | os.PathLike = "models",
              poll: float = POLL_SECONDS, dead_after: float = DEAD_AFTER_SECONDS
              ) -> TrainingResult:
        """Train ``config`` (a dict of config.yaml's sections, or a recipe's path), call
        ``on_round`` after each round, and return the result; the model is saved in
        ``out`` as ``client.py`` saves it. An interrupt (Ctrl-C, the notebook's stop
        button) or an exception of ``on_round`` cancels the run on the coordinator."""
        from thrift_trainer.client import cli
        from thrift_trainer.client.errors import ClientError
        from thrift_trainer.client.session import Coordinators, Endpoint, follow_training

        request = cli.config_request(_run_config(config), run_id or uuid.uuid4().hex[:12])
        self._configure_security()
        coordinators = Coordinators([Endpoint(self.host, self.port, self.connect_timeout)])
        watcher = _RoundWatcher(request.run_id, on_round)
        try:
            result = follow_training(coordinators, request, watcher, poll, dead_after)
        except ClientError as exc:
            if watcher.failure is not None:  # the run is cancelled: on_round's error now
                raise watcher.failure from None
            if exc.exit_code in INTERRUPTED:  # the run was cancelled: interrupt as asked
                raise KeyboardInterrupt(str(exc)) from None
            raise TrainingError(str(exc)) from None
        kept = cli.keep_result(result, request, Path(out))
        try:
            watcher.finish(kept["history"], result.rounds)
        except _CallbackFailed:  # the run has ended: nothing to cancel
            raise watcher.failure from None
        return TrainingResult.from_run(kept, result, self.plugins, self.plugin_dir)

    def _configure_security(self) -> None:
        """The token and TLS of this coordinator for the calls from now on (this process
        talks to one trainer's coordinators at a time, as the client does)."""
        from thrift_trainer.wire import security

        settings = security.current()
        token = self.token or security.token_from(None)
        tls = security.client_context(str(self.tls_ca)) if self.tls_ca else settings.client_tls
        security.configure(dataclasses.replace(settings, token=token, client_tls=tls))


def _run_config(config: dict[str, Any] | str | os.PathLike) -> Any:
    """The merged RunConfig of a dict of sections or a recipe file; RunConfigError (a
    ValueError) names the key at fault, as ``client.py --config`` does."""
    from thrift_trainer.training.run_config import load_run_config

    if isinstance(config, (str, os.PathLike)):
        return load_run_config(config, [])
    return load_run_config(None, [], sections=config)
