"""The checks a node's result passes before its round may use it, as one pluggable step.

Each filter may look at a result twice: at its update as it came (`check_payload`, before
anything is decoded: a compressed payload could claim far more memory than it weighs),
then at the decoded update with its unit, node and sample count (`check`). A filter
refuses a result by raising ValueError (the engine then counts a failure of the node,
benches it and gives the unit to another). The run builds the filters of each round
(`round_filters`): the payload's form (its codec, tensors and decoded size:
training/payload_checks.py), the algorithm's sample-count and tensor checks
(`Algorithm.check_samples`, `Algorithm.check_update`: names, shapes, dtypes, finite values)
and the norm guard (engine/update_norms.py). A new filter is a class here with a `check`
(and a `check_payload` if it can tell before decoding), added to `round_filters`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from thrift_trainer.engine.update_norms import NormGuard, RecentNorms
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.compression import decompress
from thrift_trainer.training.payload_checks import PayloadForm, check_payload
from thrift_trainer.training.units import TensorSpecs, UnitSpec, Weights
from thrift_trainer.training.update_checks import check_sample_count, check_update_form


@dataclass(frozen=True)
class Candidate:
    """A result the round has not accepted yet."""

    unit: UnitSpec
    node: str
    update: Weights
    num_samples: int


@dataclass(frozen=True)
class RoundView:
    """What a filter may know of its round while it checks a result."""

    wait_seconds: float  # how long a filter may wait (for peers of the round)
    settled: Callable[[], bool]  # True once the round is over or the run cancelled
    # a node whose refused result this one shows was right after all: off the bench
    vindicate: Callable[[str], None] = lambda node: None


class UpdateFilter:
    """One check of a round's results; `start_round`/`end_round` frame each round."""

    def start_round(self, quorum: int, nodes: int) -> None:
        """A round of ``quorum`` wanted results over ``nodes`` nodes begins."""

    def check_payload(self, payload: Weights) -> None:
        """Before decoding: raise ValueError to refuse the update as it came."""

    def check(self, candidate: Candidate, round_view: RoundView) -> None:
        """Raise ValueError (its message says why) to refuse the result."""
        raise NotImplementedError

    def end_round(self) -> None:
        """The round is over: stop waiting on it."""


class Payload(UpdateFilter):
    """The update as it came holds what the run asked for (training/payload_checks.py)."""

    def __init__(self, form: PayloadForm) -> None:
        self.form = form

    def check_payload(self, payload: Weights) -> None:
        check_payload(payload, self.form)

    def check(self, candidate: Candidate, round_view: RoundView) -> None:
        """Nothing more once decoded: the other filters look at the tensors."""


class SampleCount(UpdateFilter):
    """A sample count the unit could have produced (the count weighs the average)."""

    def __init__(self, check: Callable[[UnitSpec, int], None]) -> None:
        self._check = check

    def check(self, candidate: Candidate, round_view: RoundView) -> None:
        self._check(candidate.unit, candidate.num_samples)


class Tensors(UpdateFilter):
    """The update's tensors fit what was sent (names, shapes, dtypes; finite values)."""

    def __init__(self, check: Callable[[Weights], None]) -> None:
        self._check = check

    def check(self, candidate: Candidate, round_view: RoundView) -> None:
        self._check(candidate.update)


class NormLimit(UpdateFilter):
    """Refuses an update far larger than its peers and the recent ones; keeps its history
    across rounds, so one instance serves a whole run (or ``recent``, a run's history, is
    shared by the instances of rounds that run at once)."""

    def __init__(self, factor: float | None, recent: RecentNorms | None = None) -> None:
        self.guard = NormGuard(factor, recent=recent)

    def start_round(self, quorum: int, nodes: int) -> None:
        self.guard.start_round(quorum, nodes)

    def check(self, candidate: Candidate, round_view: RoundView) -> None:
        # A large update waits for peers of its round: refused only if it is far above
        # them too, so growing updates of an unstable run bench no one.
        self.guard.check(candidate.update, candidate.unit.unit_id, candidate.node,
                         round_view.wait_seconds, round_view.settled, round_view.vindicate)

    def end_round(self) -> None:
        self.guard.end_round()


def any_positive_count(unit: UnitSpec, num_samples: int) -> None:
    """The check of a sample count when the unit's size is unknown: at least 1."""
    check_sample_count(num_samples, None)


DEFAULT_FILTERS = (SampleCount(any_positive_count),)  # what a round checks at least


def round_filters(algorithm: Algorithm, weights: Weights, norm_limit: NormLimit | None,
                  codec: str = "none") -> list[UpdateFilter]:
    """The filters of a round whose units were sent ``weights`` and whose updates come in
    ``codec`` (the run's ``compression.up``), cheapest first."""
    form = PayloadForm.of_model(codec, algorithm.expected_update(weights), weights)
    filters: list[UpdateFilter] = [
        Payload(form),
        SampleCount(algorithm.check_samples),
        Tensors(lambda update: algorithm.check_update(update, weights))]
    return filters + ([norm_limit] if norm_limit is not None else [])


def relayed_filters(expected: TensorSpecs | None, weights: Weights, codec: str,
                    norm_limit: NormLimit) -> list[UpdateFilter]:
    """The filters of a relay's round over its members: the coordinator's own checks as far
    as the unit tells them (the tensors it expects come with it; the model is what the
    unit's weights are), sample counts within each slice, and the run's norm guard."""
    return [Payload(PayloadForm.of_model(codec, expected, weights)),
            SampleCount(within_slice),
            Tensors(lambda update: check_update_form(update, expected)),
            norm_limit]


def within_slice(unit: UnitSpec, num_samples: int) -> None:
    """A sample count from 1 to the unit's index range, when it has one."""
    has_range = unit.index_start is not None and unit.index_stop is not None
    check_sample_count(num_samples, unit.index_stop - unit.index_start if has_range else None)


def decoded(filters: Sequence[UpdateFilter], payload: Weights) -> Weights:
    """The update a result's payload encodes, decoded once every filter let it through as
    it came; ValueError from the first that refuses it, or from a malformed payload."""
    for update_filter in filters:
        update_filter.check_payload(payload)
    return decompress(payload)


def run_filters(filters: Sequence[UpdateFilter], candidate: Candidate,
                round_view: RoundView) -> None:
    """Every filter's check in turn; the first refusal (ValueError) stops."""
    for update_filter in filters:
        update_filter.check(candidate, round_view)
