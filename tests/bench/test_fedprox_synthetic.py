"""bench/fedprox_synthetic.py and its plug-ins (bench/fedprox_plugins.py): the arguments,
the devices as clients, the stragglers every process computes alike, FedAvg leaving them
out of the average, and the quick run through real processes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(_BENCH))

import fedprox_plugins as plugins  # noqa: E402
import fedprox_synthetic as bench  # noqa: E402

from thrift_trainer.training.clients.synthetic import synthetic  # noqa: E402
from thrift_trainer.training.units import UnitResult, UnitSpec  # noqa: E402


def test_defaults_are_the_paper_s_and_quick_is_small() -> None:
    args = bench.parse_args([])
    assert (args.rounds, args.epochs, args.batch, args.lr, args.mu) == (40, 20, 10, 0.01, 1.0)
    assert args.stragglers == [0.0, 0.5, 0.9] and args.synthetic == [(1.0, 1.0)]
    assert args.json == bench.RESULTS and args.plot == bench.PLOT
    assert bench.runs_of(args) == [(0.0, "fedavg"), (0.0, "fedprox_mu1"),
                                   (0.5, "fedavg"), (0.5, "fedprox_mu0"),
                                   (0.5, "fedprox_mu1"), (0.9, "fedavg"),
                                   (0.9, "fedprox_mu0"), (0.9, "fedprox_mu1")]
    quick = bench.parse_args(["--quick"])
    assert (quick.rounds, quick.epochs, quick.stragglers) == (2, 1, [0.5])
    assert quick.json is None and quick.plot is None
    assert bench.parse_args(["--synthetic", "0,0", "--synthetic", "0.5,0.5"]).synthetic == [
        (0.0, 0.0), (0.5, 0.5)]
    for bad in (["--synthetic", "1"], ["--synthetic", "-1,0"], ["--stragglers", "0.5,0.5"],
                ["--stragglers", "1.5"], ["--rounds", "0"], ["--lr", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_each_client_is_one_device_s_training_examples() -> None:
    train = plugins.synthetic_devices("train", alpha=1, beta=1, seed=3)
    held = plugins.synthetic_devices("validation", alpha=1, beta=1, seed=3)
    assert plugins.synthetic_devices("validation", 1, 1, 3, score="train").fingerprint() \
        == train.fingerprint()
    devices = synthetic(1.0, 1.0, 3)
    parts = plugins.device_parts(train.targets.numpy(), 30, seed=7)
    assert len(parts) == 30 and len(train) + len(held) == sum(len(y) for _, y in devices)
    for (inputs, labels), part in zip(devices, parts, strict=True):
        cut = plugins.device_split(len(labels), plugins.HELD_OUT)
        assert len(part) == cut and cut == round(0.8 * len(labels))
        np.testing.assert_array_equal(train.inputs.numpy()[part], inputs[:cut])
        np.testing.assert_array_equal(train.targets.numpy()[part], labels[:cut])
    with pytest.raises(plugins.ClientsError, match="count must be 30"):
        plugins.device_parts(train.targets.numpy(), 10, seed=7)
    with pytest.raises(plugins.ClientsError, match="data set is another"):
        plugins.device_parts(np.zeros(len(train), dtype=np.int64), 30, seed=7)


def test_stragglers_are_the_share_of_the_round_s_clients_the_same_everywhere() -> None:
    config = {"seed": 5, "epochs": 20, "stragglers": 0.9,
              "clients": {"count": 30, "per_round": 10}}
    for round_index in range(1, 30):
        clients = plugins.round_clients(config, round_index)
        assert len(clients) == 10
        late = plugins.stragglers_of(round_index, clients, 0.9, 5)
        assert len(late) == 9 and late <= set(clients)
        assert late == plugins.stragglers_of(round_index, list(reversed(clients)), 0.9, 5)
        for client in clients:
            epochs = plugins.local_epochs(config, round_index, client)
            assert (1 <= epochs <= 20) if client in late else epochs == 20
    assert len(plugins.stragglers_of(1, [f"client{k}" for k in range(10)], 0.5, 5)) == 5
    assert not plugins.stragglers_of(1, [f"client{k}" for k in range(10)], 0.0, 5)
    drawn = [plugins.straggler_epochs(r, f"client{k}", 20, 1) for r in range(1, 40)
             for k in range(30)]
    assert set(drawn) == set(range(1, 21))  # uniform in 1..E


def test_the_algorithm_checks_its_keys_and_fedavg_drops_the_stragglers() -> None:
    checked = plugins.StragglerFedProx.check_config(
        "fedprox_plugins:Multinomial", {"mu": 0.0, "stragglers": 0.5, "drop_stragglers": True,
                                        "epochs": 20, "local_optimizer": "sgd",
                                        "seed": 2})
    assert checked["stragglers"] == 0.5 and checked["drop_stragglers"] and checked["mu"] == 0
    for bad in ({"stragglers": 2}, {"stragglers": True}, {"drop_stragglers": 1},
                {"stragglers": 0.5, "local_steps": 3}):
        with pytest.raises(plugins.tt.ConfigError):
            plugins.StragglerFedProx.check_config("fedprox_plugins:Multinomial", bad)

    class Replay(plugins.StragglerFedProx):
        def __init__(self, config: dict) -> None:  # the coordinator half without data
            self.config = config
            self.seen: list[str] = []

        def apply(self, weights, combined):
            return combined

        def combine(self, results):
            self.seen = [result.unit.client for result in results]
            return {}

    config = {"seed": 2, "stragglers": 0.5, "drop_stragglers": True,
              "clients": {"count": 30, "per_round": 10}}
    clients = plugins.round_clients(config, 3)
    results = [UnitResult(UnitSpec(name, "", client=name), {}, 1) for name in clients]
    late = plugins.stragglers_of(3, clients, 0.5, 2)
    algorithm = Replay(config)
    algorithm.aggregate(3, {}, results, [])
    assert sorted(algorithm.seen) == sorted(set(clients) - late) and len(late) == 5
    kept = Replay({**config, "drop_stragglers": False})
    kept.aggregate(3, {}, results, [])
    assert sorted(kept.seen) == sorted(clients)
    every = Replay({**config, "stragglers": 1.0})
    assert every.aggregate(3, {"w": 1}, results, []) == {"w": 1}  # nobody left: unchanged


def test_stability_figures() -> None:
    figures = bench.stability([3.0, 2.0, 2.5, 2.0, 2.2], last=3)
    assert figures["last_mean"] == pytest.approx(2.2333333)
    assert figures["last_mean_abs_change"] == pytest.approx((0.5 + 0.2) / 2)
    assert figures["largest_rise"] == pytest.approx(0.5)
    assert bench.stability([3.0, 2.0], last=3)["largest_rise"] == 0.0
    assert bench.checkpoints(40) == [1, 5, 10, 20, 40]


def test_replot_draws_one_picture_of_several_results_files(tmp_path: Path, capsys) -> None:
    files = []
    for pair in ((1.0, 1.0), (0.0, 0.0)):
        runs = [{"synthetic": list(pair), "stragglers": share, "method": key,
                 "label": bench.method_of(key).label, "rounds": 3,
                 "global_train_loss": [2.0, 1.5 + share, 1.2],
                 "stability": bench.stability([2.0, 1.5 + share, 1.2], 2),
                 "final": {"held_out_accuracy": 0.5}}
                for share in (0.0, 0.9) for key in ("fedavg", "fedprox_mu1")]
        path = tmp_path / f"{pair[0]}.json"
        path.write_text(json.dumps({"settings": {"last": 2}, "runs": runs}))
        files.append(str(path))
    picture = tmp_path / "both.png"
    assert bench.main(["--replot", *files, "--plot", str(picture)]) == 0
    out = capsys.readouterr().out
    assert "Synthetic(1,1)" in out and "Synthetic(0,0)" in out
    assert ("| 90% | FedProx, mu = 1 | 2.0000 | 1.2000 | 1.8000 | 0.6000 | 1.2000 | 0.4000 | "
            "0.500 |") in out  # rounds 1 and 3; last 2: mean, std, change; the rise
    assert picture.stat().st_size > 0


@pytest.mark.processes
def test_the_quick_run_trains_both_methods_through_real_processes(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    assert bench.main(["--quick", "--json", str(out), "--workdir", str(tmp_path / "w")]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(run["method"], run["stragglers"], run["rounds"]) for run in runs] == [
        ("fedavg", 0.5, 2), ("fedprox_mu1", 0.5, 2)]
    for run in runs:
        losses = run["global_train_loss"]
        assert all(math.isfinite(loss) and 0 < loss < 2 * math.log(10) for loss in losses)
        assert losses[-1] != pytest.approx(math.log(10))  # the zero model has moved
        # the coordinator's last score is the saved model's training loss over all devices
        assert run["final"]["train_loss"] == pytest.approx(losses[-1], rel=1e-4)
        assert 0 < run["final"]["held_out_accuracy"] < 1
