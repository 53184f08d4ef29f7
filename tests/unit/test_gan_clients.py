"""FL-GAN and MD-GAN on federated clients, in process: the MNIST training part dealt to
the clients, a round's units (one per sampled client, or one per slot and its client),
the images a unit reads, and the runs refused in one line before round 1."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_client_settings import _prepare
from thrift_trainer.training.algorithms.md_gan_node import _real
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.gan_training import client_parts, real_batch
from thrift_trainer.training.units import UnitJob

MNIST = DEFAULT_DATA_ROOT / "mnist"
FL_GAN = ["run.algorithm=fl_gan", "run.model=mlpgan28-tiny", "run.dataset=mnist",
          "fl_gan.batch_size=64", "clients.count=16", "clients.partition=dirichlet",
          "clients.alpha=1.0", "clients.per_round=3", "clients.over_select=1.5"]
MD_GAN = ["run.algorithm=md_gan", "run.model=mlpgan28-tiny", "run.dataset=mnist",
          "md_gan.workers=3", "md_gan.batch_size=32", "md_gan.k=1", "clients.count=3",
          "clients.partition=classes", "clients.classes_per_client=4"]


def test_fl_gan_asks_the_sampled_clients_and_weighs_them_by_their_images():
    setup = _prepare(FL_GAN)
    algorithm = setup.algorithm
    units = algorithm.plan_round(1)
    assert len(units) == 5 and algorithm.quorum(len(units)) == 3  # ceil(3 x 1.5) asked
    assert all(unit.client == unit.unit_id for unit in units)
    sizes = algorithm.partition.sizes
    assert sum(sizes) == 8000 and len(set(sizes)) > 1
    assert [algorithm.unit_samples(unit) for unit in units] == \
        [sizes[int(unit.client[6:])] for unit in units]
    assert setup.units_per_round == 5


def test_an_fl_gan_unit_trains_on_its_clients_images():
    from thrift_trainer.training.algorithms.fl_gan import FLGan, _shard_of

    algorithm = _prepare(FL_GAN).algorithm
    unit = algorithm.plan_round(1)[0]
    job = UnitJob("r", 1, unit, algorithm.model, algorithm.config, {})
    slot, shard = _shard_of(job, MNIST, FLGan.unit_config(job))
    parts, _ = client_parts(MNIST, algorithm.roster.settings, algorithm.config["seed"])
    assert slot == int(unit.client[6:]) and np.array_equal(shard, parts[slot])


def test_an_md_gan_slot_reads_its_clients_images():
    algorithm = _prepare(MD_GAN).algorithm
    units = algorithm.plan_round(1)
    assert [unit.client for unit in units] == ["client0", "client1", "client2"]
    parts, record = client_parts(MNIST, algorithm.client_settings, algorithm.config["seed"])
    assert algorithm.partition == record
    assert algorithm.epoch_iterations == min(len(part) for part in parts) // 32
    for slot, part in enumerate(parts):
        real = _real(MNIST, algorithm.config, slot, 1)
        images = {real_batch(MNIST, np.array([i])).numpy().tobytes() for i in part}
        assert all(image.numpy().tobytes() in images for image in real[:8])


@pytest.mark.parametrize("overrides, why", [
    ([*FL_GAN, "clients.count=200"], "fewer than batch_size 64"),
    ([*MD_GAN, "clients.count=2"], "clients.count \\(2\\) must equal md_gan.workers \\(3\\)"),
    ([*MD_GAN, "clients.per_round=2"], "leave clients.per_round at 0"),
    ([*MD_GAN, "clients.over_select=1.5"], "clients.over_select at 1"),
    ([*MD_GAN, "clients.count=3", "clients.partition=classes",
      "clients.classes_per_client=1", "md_gan.batch_size=1000"], "fewer than batch_size"),
])
def test_gan_runs_on_clients_that_cannot_work_are_refused_in_one_line(overrides, why):
    from thrift_trainer.coordinator.run_setup import InvalidRun

    with pytest.raises(InvalidRun, match=f"^clients: .*{why}") as info:
        _prepare(overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("algorithm", ["fl_gan", "md_gan"])
def test_gan_clients_must_be_parts_of_the_mnist_training_part(algorithm):
    from thrift_trainer.coordinator.run_setup import InvalidRun

    with pytest.raises(InvalidRun, match="placement partition"):
        _prepare([f"run.algorithm={algorithm}", "run.model=mlpgan28-tiny",
                  "run.dataset=mnist", "clients.placement=nodes"])


def test_a_node_that_builds_no_torch_model_still_says_which_clients_it_holds():
    from thrift_trainer.engine.nodes.thrift_client import run_answer
    from thrift_trainer.wire.generated import ttypes

    held = run_answer(ttypes.RunCheck(ok=True, plugins={}, clients=["client1"]))
    assert held.facts is not None and held.facts.clients == ("client1",)
    assert not held.facts.model_fingerprint  # nothing to compare: it is not left out
    assert run_answer(ttypes.RunCheck(ok=True, plugins={})).facts is None  # holds every one
