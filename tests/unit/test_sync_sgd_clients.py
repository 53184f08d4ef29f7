"""sync_sgd on federated clients, in process: a round samples clients, K of them close it,
and a node's unit is the mean gradient over a batch of its client's examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_client_settings import _prepare
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.clients.data_parts import parts_of
from thrift_trainer.training.clients.roster import batch_of
from thrift_trainer.training.unit_parts import weighted_mean
from thrift_trainer.training.units import UnitJob

LETTERS = Path(__file__).resolve().parents[2] / "data" / "letters"
RUN = ["run.algorithm=sync_sgd", "run.model=mlp_classifier", "data.format=letters",
       "clients.count=8", "clients.partition=quantity", "clients.per_round=4",
       "sync_sgd.num_workunits_per_update=3", "sync_sgd.images_per_work_unit=900",
       "sync_sgd.batch_size=64"]


def test_a_round_asks_the_sampled_clients_and_closes_at_k():
    algorithm = _prepare(RUN).algorithm
    units = algorithm.plan_round(1)
    assert [unit.client for unit in units] == [unit.unit_id for unit in units]
    assert len(units) == 4 and algorithm.quorum(len(units)) == 3
    assert algorithm.plan_round(2) != units  # each round samples its own
    assert not algorithm.rounds_from_passes  # clients are sampled, not passes over the data
    sizes = algorithm.partition.sizes
    for unit in units:
        assert algorithm.unit_samples(unit) == min(900, sizes[int(unit.client[6:])])
    assert min(sizes) < 900 < max(sizes)  # both kinds of client are there


def test_the_quorum_is_at_most_the_round_target():
    algorithm = _prepare([*RUN, "clients.per_round=2", "clients.over_select=2.0"]).algorithm
    assert len(algorithm.plan_round(1)) == 4 and algorithm.quorum(4) == 2


def test_without_clients_sync_sgd_walks_passes_as_before():
    algorithm = _prepare(RUN[:3]).algorithm
    assert algorithm.rounds_from_passes and algorithm.partition is None
    assert algorithm.plan_round(1)[0].unit_id.startswith("unit0-")


def _job(algorithm, unit, round_index: int = 1) -> UnitJob:
    return UnitJob("run", round_index, unit, "mlp_classifier", algorithm.config,
                   algorithm.initial_weights(), dataset="letters")


def test_a_unit_is_the_gradient_over_a_batch_of_its_clients_examples():
    algorithm = _prepare(RUN).algorithm
    setup = algorithm.state.setup
    parts, _ = parts_of(setup, algorithm.roster.settings, algorithm.config["seed"])
    big = max(algorithm.plan_round(1), key=algorithm.unit_samples)
    own = parts[int(big.client[6:])]
    first = batch_of(own, 900, algorithm.config["seed"], 1, big.client)
    assert len(first) == 900 and set(first) <= set(own)
    assert not np.array_equal(first, batch_of(own, 900, algorithm.config["seed"], 2,
                                              big.client))  # another batch next round
    whole = SyncSGD.run_unit(_job(algorithm, big), LETTERS)
    assert whole.num_samples == 900
    shares = [SyncSGD.run_unit_part(_job(algorithm, big), LETTERS, part, 3)
              for part in range(3)]
    joined = weighted_mean([share for share in shares if share is not None])
    for name, value in whole.update.items():
        np.testing.assert_allclose(joined.update[name], value, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("overrides, why", [
    (["run.algorithm=sync_sgd", "clients.count=4"], "sync_sgd takes federated clients "
     "with torch models"),
    (["run.algorithm=sync_sgd", "run.model=dcgan28-tiny", "run.dataset=mnist",
      "clients.count=4"], "'dcgan28-tiny' walks its data set in index ranges"),
])
def test_sync_sgd_refuses_clients_for_the_letters_mlp_and_the_gans(overrides, why):
    from thrift_trainer.coordinator.run_setup import InvalidRun

    with pytest.raises(InvalidRun, match=f"^clients: .*{why}"):
        _prepare(overrides)
