"""The notebook API end to end: thrift_trainer.local_cluster starts real node and
coordinator processes on 127.0.0.1, trains a torch model from a dict with a callback per
round, hands the trained module back, and ends its processes by PID when the block ends,
also when the block raises or the run is interrupted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import thrift_trainer as tt
from devtools.local_cluster import REPO
from thrift_trainer.client.session import Endpoint, call
from thrift_trainer.training import plugins
from thrift_trainer.training.data import preprocessing
from thrift_trainer.wire.generated import ttypes

DATA = REPO / "data"
VALIDATION = DATA / "letters" / "validate_letters.txt"
TINY = {"run": {"model": "mlp_classifier", "rounds": 2}, "data": {"format": "letters"},
        "delta_avg": {"units": 2}}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_local_cluster_trains_a_dict_and_gives_the_trained_module_back(
        tmp_path: Path) -> None:
    rounds: list[tt.RoundInfo] = []
    with tt.local_cluster(nodes=2, data_root=DATA, workdir=tmp_path) as cluster:
        pids = cluster.pids
        assert len(pids) == 3 and not any(gone(pid) for pid in pids)
        result = cluster.train(TINY, on_round=rounds.append, run_id="nb1")
    assert all(gone(pid) for pid in pids)
    assert [(r.run_id, r.round, r.rounds) for r in rounds] == [("nb1", 1, 2), ("nb1", 2, 2)]
    assert rounds[-1].validation_error == result.validation_error
    assert [row["round"] for row in result.history] == [1, 2]
    assert result.run_id == "nb1" and result.model_path == tmp_path / "models" / "nb1.npz"
    assert result.model_path.is_file() and result.export_path.is_file()
    assert Path(result.run_dir) == tmp_path / "runs" / "nb1"

    module = result.module()
    assert isinstance(module, torch.nn.Module)
    inputs, targets = preprocessing.labelled(result.description["data"], str(VALIDATION))
    with torch.no_grad():
        wrong = (module(inputs).argmax(dim=1) != targets).float().mean().item()
    assert wrong == pytest.approx(result.validation_error, abs=1e-6)
    assert result.evaluate()["error"] == pytest.approx(result.validation_error, abs=1e-6)


class Unwanted(Exception):
    """What a callback raises when the notebook no longer wants the run."""


def test_a_numpy_model_is_scored_runs_are_cancelled_and_a_raising_block_ends_every_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(info: tt.RoundInfo) -> None:
        raise KeyboardInterrupt  # as the notebook's stop button does, mid-run

    def refuse(info: tt.RoundInfo) -> None:
        raise Unwanted(info.round)

    monkeypatch.chdir(tmp_path)  # a workdir relative to the notebook's folder
    letters = {"run": {"rounds": 1}, "delta_avg": {"epochs": 1}}
    long_run = {**letters, "run": {"rounds": 500}}
    with pytest.raises(tt.RunConfigError, match="did you mean 'run.rounds'"), \
            tt.local_cluster(nodes=1, data_root=DATA, workdir="cluster") as cluster:
        pids = cluster.pids
        result = cluster.train(letters)
        assert result.model_path.parent == tmp_path / "cluster" / "models"
        with pytest.raises(ValueError, match="the letters MLP, a numpy model, not a torch"):
            result.module()
        assert result.evaluate()["error"] == pytest.approx(result.validation_error, abs=1e-9)
        assert len(result.predict(VALIDATION)) == 3500

        coordinator = Endpoint("127.0.0.1", cluster.coordinator_port)
        for callback, raised, run_id in ((interrupt, KeyboardInterrupt, "stopped"),
                                         (refuse, Unwanted, "unwanted")):
            with pytest.raises(raised):
                cluster.train(long_run, on_round=callback, run_id=run_id)
            status = call(coordinator, "status", ttypes.StatusRequest(run_id=run_id))
            assert status.state == "cancelled" and status.round < 500, run_id
        with pytest.raises(tt.TrainingError, match="nowhere"):  # refused by the coordinator
            cluster.train({"run": {"dataset": "nowhere"}})
        cluster.train({"run": {"roundz": 2}})  # refused before anything is sent: raises
    assert all(gone(pid) for pid in pids) and cluster.pids == []


PLUGIN = '''
from torch import nn


class Tiny(nn.Module):
    def __init__(self, in_features, num_classes, width=8):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(in_features, width), nn.ReLU(),
                                    nn.Linear(width, num_classes))

    def forward(self, x):
        return self.layers(x)
'''


def test_a_plugin_model_comes_back_as_an_instance_of_its_own_class(tmp_path: Path) -> None:
    (tmp_path / "nb_models.py").write_text(PLUGIN)
    config = {"run": {"model": "nb_models:Tiny", "rounds": 1, "model_args": {"width": 12}},
              "data": {"format": "letters"}, "delta_avg": {"units": 1}}
    try:
        with tt.local_cluster(nodes=1, plugins=["nb_models"], plugin_dir=tmp_path,
                              data_root=DATA, workdir=tmp_path / "cluster") as cluster:
            result = cluster.train(config)
        module = result.module()  # allows nb_models in this process, as the cluster did
        assert type(module).__module__ == "nb_models" and type(module).__name__ == "Tiny"
        assert module.layers[0].out_features == 12
        inputs, targets = preprocessing.labelled(result.description["data"], str(VALIDATION))
        with torch.no_grad():
            wrong = (module(inputs).argmax(dim=1) != targets).float().mean().item()
        assert wrong == pytest.approx(result.validation_error, abs=1e-6)
    finally:
        plugins.reset()  # nothing of this test's plug-in is left allowed for the next
