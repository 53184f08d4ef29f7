"""The single-process baselines: a plain GAN with batch b or N x b, and an algorithm's own
maths in one process with the hooks MD-GAN uses."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.training.algorithms.md_gan import MDGan
from thrift_trainer.training.baselines.standalone import train_in_process
from thrift_trainer.training.baselines.standalone_gan import train_standalone_gan
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import gan_models

torch.set_num_threads(1)

MNIST = DEFAULT_DATA_ROOT / "mnist"
_script = importlib.util.spec_from_file_location(
    "standalone_gan_script", Path(__file__).resolve().parents[2] / "scripts" / "standalone_gan.py")
_command = importlib.util.module_from_spec(_script)
_script.loader.exec_module(_command)
main = _command.main


def test_the_standalone_gan_trains_and_is_repeatable() -> None:
    start, _ = gan_models.build_gan(gan_models.gan_spec("dcgan28-tiny"), seed=4)
    seen: list[int] = []
    g1, _ = train_standalone_gan("dcgan28-tiny", 16, 3, seed=4,
                                 on_iteration=lambda i, g: seen.append(i))
    g2, _ = train_standalone_gan("dcgan28-tiny", 16, 3, seed=4)
    assert seen == [1, 2, 3]
    for a, b in zip(g1.parameters(), g2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, s) for a, s in zip(g1.parameters(), start.parameters(),
                                                     strict=True))


def test_the_command_scores_batch_b_and_n_times_b(capsys) -> None:
    assert main(["--model", "dcgan28-tiny", "--batch-size", "8", "--workers", "2",
                 "--iterations", "2", "--eval-n", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["batch 8", "batch 16"]


def test_md_gan_runs_in_one_process_with_a_session_store() -> None:
    algorithm = MDGan("dcgan28-tiny", {"workers": 2, "batch_size": 8}, MNIST)
    store = SessionStore()
    before = algorithm.initial_weights()
    after = train_in_process(algorithm, 2, sessions=store)
    assert len(store) == 2  # one discriminator per slot
    assert any((after[k] != before[k]).any() for k in before)
