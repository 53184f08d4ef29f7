"""Differentially private federated runs (DP-FedAvg, docs/privacy.md) through real
processes: each round's epsilon equals dp-accounting's own in the run's results, files,
status and /metrics, a run without noise and with a clip no update reaches equals its
in-process replay, and so do noised runs, node-resident clients' included: their noise and
client draws are keyed by the run's secret noise key, which the replay reads from the run's
checkpoint, and which no file the requester or a node gets holds."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import dp_accounting  # requirements-dev.txt installs it (the privacy extra)
import numpy as np
import pytest

from devtools import local_cluster
from devtools.fedavg_replay import replay as _replay
from tests.e2e.test_federated_clients import (
    FEDERATED,
    RESIDENT,
    SHIPPED,
    SITES,
    SITES_PLUGIN,
    _overrides,
    _run_dir,
    _sites,
    _with_sets,
    four_sites,
)
from thrift_trainer.coordinator.checkpoint import noise_key
from thrift_trainer.training.outputs.model_file import load_model

pytestmark = pytest.mark.processes

CLIENTS, PER_ROUND, ROUNDS = 12, 4, 3
NOISED = ["--set", "privacy.clip=0.5", "--set", "privacy.noise_multiplier=1.1",
          "--set", "privacy.delta=0.001", "--set", "clients.sampling=poisson"]


def _expected_epsilons() -> list[float]:
    """dp-accounting's epsilon after each round: a Poisson-sampled Gaussian per round."""
    spent = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(
        PER_ROUND / CLIENTS, dp_accounting.GaussianDpEvent(1.1))
    epsilons = []
    for _ in range(ROUNDS):
        spent.compose(event)
        epsilons.append(spent.get_epsilon(0.001))
    return epsilons


def test_a_private_run_reports_dp_accountings_epsilon_after_every_round(cluster):
    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    coordinator = cluster.start_coordinator(2, "--dashboard-port", "0")
    url = coordinator.wait_for(r"dashboard at (http://127\.0\.0\.1:\d+/)").group(1)
    result = cluster.train_json(*FEDERATED, *NOISED, "--set", f"run.rounds={ROUNDS}")
    expected = _expected_epsilons()
    history = [row["epsilon"] for row in result["history"]]
    assert history == pytest.approx(expected, rel=5e-4), (history, expected)
    run_dir = _run_dir(cluster, result)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["epsilon"] for row in rows] == history
    status = local_cluster.run_client(["status", "127.0.0.1", str(coordinator.port),
                                       result["run_id"], "--json"], cluster.workdir)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["clients"]["epsilon"] == history[-1]
    with urllib.request.urlopen(f"{url}metrics", timeout=30) as response:
        metrics = response.read().decode()
    found = re.search(rf'trainer_run_metric{{metric="epsilon",run="{result["run_id"]}"}} '
                      r"([0-9.e+-]+)", metrics)
    assert found and float(found.group(1)) == pytest.approx(history[-1], rel=1e-9)
    text = cluster.client(*FEDERATED, *NOISED, "--set", "run.rounds=1")
    assert text.returncode == 0, text.stderr
    assert f"Privacy (round 1): epsilon {expected[0]:.4g} spent" in text.stdout


def test_a_run_without_noise_and_a_clip_never_reached_equals_its_replay(cluster):
    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    cluster.start_coordinator(2)
    private = ["privacy.clip=1000000.0", "privacy.noise_multiplier=0.0"]
    result = cluster.train_json(*FEDERATED, *[part for item in private
                                              for part in ("--set", item)],
                                "--set", f"run.rounds={ROUNDS}")
    run_dir = _run_dir(cluster, result)
    trained = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
               .splitlines()]
    trained = [line for line in trained if "node" in line]
    assert len(trained) == ROUNDS * PER_ROUND, trained
    assert all(row["epsilon"] is None for row in  # no noise: no privacy (infinite)
               map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()))

    def clients_of(round_index: int):
        names = sorted((line["client"] for line in trained if line["round"] == round_index),
                       key=lambda name: int(name[6:]))
        return [(name, SHIPPED) for name in names]
    expected = _replay([*_overrides(), *private], ROUNDS, clients_of,
                       noise_key=noise_key(run_dir))
    weights, _ = load_model(run_dir / "model.npz")
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # uniform weights: the plain mean of the deltas, not the example-weighted one
    weighted = _replay(_overrides(), ROUNDS, clients_of)
    assert any(not np.allclose(weighted[name], value, rtol=1e-5, atol=1e-6)
               for name, value in expected.items())


def test_a_noised_poisson_run_with_empty_rounds_equals_its_keyed_replay(cluster, monkeypatch):
    """One client a round in expectation: the key's draws leave rounds with no client
    (24 rounds: all have one with probability 3e-5), whose noise is applied all the same;
    the noise is keyed, so the replay with the run's key is exact, and the one anyone can
    compute from the public seed is not the run's. The key is in no file the requester or
    a node gets."""
    from thrift_trainer.training.clients.settings import ClientsSettings
    from thrift_trainer.training.privacy import mechanism

    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    cluster.start_coordinator(2)
    rounds = 24
    sets = [*FEDERATED, *NOISED, "--set", "clients.per_round=1", "--set", f"run.rounds={rounds}"]
    answer = cluster.client(*sets, "--json")
    assert answer.returncode == 0, answer.stderr + cluster.logs()
    result = json.loads(answer.stdout)
    run_dir = _run_dir(cluster, result)
    key = noise_key(run_dir)
    sizes = json.loads((run_dir / "partition.json").read_text())["sizes"]
    settings = ClientsSettings(count=CLIENTS, per_round=1, sampling="poisson")
    held = [name for name, size in zip(settings.names(), sizes, strict=True) if size]
    draws = {r: settings.sampled(r, 1, held, key) for r in range(1, rounds + 1)}
    assert any(not drawn for drawn in draws.values()), draws  # the key's empty rounds
    lines = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
             .splitlines()]
    for r, drawn in draws.items():
        assert sorted(line["client"] for line in lines if line["round"] == r
                      and "node" in line) == drawn, (r, lines)
    overrides = [item for item in sets if item != "--set"]
    expected = _replay(overrides, rounds, lambda r: [(name, SHIPPED) for name in draws[r]],
                       noise_key=key)
    weights, _ = load_model(run_dir / "model.npz")
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # what the seed alone gives, the draws and the noise of a generator of (seed, round):
    public = {r: settings.sampled(r, 1, held) for r in range(1, rounds + 1)}
    assert public != draws
    monkeypatch.setattr(mechanism, "noise", lambda like, std, _, r: {
        name: np.random.default_rng([mechanism.NOISE_TAG, 1, r]).normal(
            0.0, std, size=np.shape(like[name])) for name in sorted(like)})
    guessed = _replay(overrides, rounds, lambda r: [(name, SHIPPED) for name in public[r]],
                      noise_key=key)
    assert all(not np.allclose(weights[name], value, rtol=1e-3, atol=1e-3)
               for name, value in guessed.items())
    told = [answer.stdout, answer.stderr, cluster.logs(),
            *(path.read_text(errors="replace") for path in run_dir.iterdir()
              if path.name != "checkpoint.npz" and path.suffix in (".json", ".jsonl"))]
    for text in told:
        assert "noise_key" not in text and key.hex() not in text
    assert not any(key in path.read_bytes() for path in run_dir.iterdir()
                   if path.is_file() and path.name != "checkpoint.npz")


@pytest.mark.parametrize("clip", [[], ["privacy.adaptive_clip_quantile=0.5",
                                        "privacy.clip_count_stddev=1.0"]],
                         ids=["fixed-clip", "adaptive-clip"])
def test_a_private_run_killed_and_resumed_counts_each_released_round_once(cluster, clip):
    """Epsilon after the resume continues from the rounds the store holds, and the rounds
    computed again draw the same clients and noise (the noise key is the checkpoint's),
    with the clip in force that the checkpoint kept: the model equals the keyed replay."""
    rounds = 5
    sets = [*FEDERATED, *NOISED, *_with_sets(clip), "--set", f"run.rounds={rounds}"]
    run_dir, rows, _ = _killed_in_round_3_and_resumed(cluster, sets, rounds)
    spent = dp_accounting.rdp.RdpAccountant()
    for row in rows:
        spent.compose(dp_accounting.PoissonSampledDpEvent(
            PER_ROUND / CLIENTS, dp_accounting.GaussianDpEvent(1.1)))
        assert row["epsilon"] == pytest.approx(spent.get_epsilon(0.001), rel=5e-4), row
    lines = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
             .splitlines()]

    def clients_of(round_index: int):
        return [(line["client"], SHIPPED) for line in lines
                if line["round"] == round_index and "node" in line]
    clips: list[float] = []
    expected = _replay([item for item in sets if item != "--set"], rounds, clients_of,
                       watch=lambda r, algorithm, results: clips.extend(
                           algorithm.privacy_figures().values()),
                       noise_key=noise_key(run_dir))  # the key came back from the checkpoint
    if clip:  # each round clipped at the replay's clip, the resumed ones included
        assert [row["clip"] for row in rows] == pytest.approx(clips, rel=1e-9)
        assert len(set(clips)) == rounds
    weights, _ = load_model(run_dir / "model.npz")
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_node_resident_clients_train_privately_accounted_from_the_announced_roster(cluster):
    """Four clients of their nodes' own folders (three on one node, one on the other),
    Poisson-sampled two a round in expectation: q is 2 / 4 from the clients the nodes
    announced, epsilon is dp-accounting's for it, and the noised model equals its replay."""
    from thrift_trainer.training.clients.settings import ClientsSettings

    roots, sizes = four_sites(cluster.workdir)
    for key in "ab":
        cluster.add_node(0.0, "--data-root", str(roots[key]), *SITES_PLUGIN)
    cluster.start_coordinator(2, "--data-root", str(roots["coordinator"]), *SITES_PLUGIN)
    rounds = 4
    private = ["privacy.clip=0.5", "privacy.noise_multiplier=1.1", "privacy.delta=0.001",
               "clients.sampling=poisson", "clients.per_round=2", f"run.rounds={rounds}"]
    result = cluster.train_json(*_with_sets(SITES + private))
    run_dir = _run_dir(cluster, result)
    record = json.loads((run_dir / "partition.json").read_text())
    names = ["clinic", "ward-1", "ward-2", "ward-3"]
    assert record["names"] == names and record["sizes"] == [sizes[n] for n in names], record
    spent = dp_accounting.rdp.RdpAccountant()
    expected = []
    for _ in range(rounds):
        spent.compose(dp_accounting.PoissonSampledDpEvent(
            2 / 4, dp_accounting.GaussianDpEvent(1.1)))
        expected.append(spent.get_epsilon(0.001))
    history = [row["epsilon"] for row in result["history"]]
    assert [float(f"{e:.3g}") for e in history] == [float(f"{e:.3g}") for e in expected]
    lines = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
             .splitlines()]
    settings = ClientsSettings(per_round=2, sampling="poisson", placement="nodes")
    key = noise_key(run_dir)
    draws = {r: settings.sampled(r, 1, names, key) for r in range(1, rounds + 1)}
    for r, drawn in draws.items():  # the keyed draws among the four, every client trained
        assert sorted(line["client"] for line in lines if line["round"] == r) == drawn, \
            (r, lines)
    folders = {name: roots["b" if name == "clinic" else "a"] / "sites" / name
               for name in names}
    replayed = _replay([*RESIDENT, "clients.placement=nodes", *private], rounds,
                       lambda r: [(name, folders[name]) for name in draws[r]],
                       announced={name: sizes[name] for name in names}, noise_key=key)
    weights, _ = load_model(run_dir / "model.npz")
    for name, value in replayed.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_adaptive_clip_moves_toward_the_median_norm_and_the_run_equals_its_replay(cluster):
    """Started at 4, above every client's update norm (about 1.3 here), the clip of
    quantile 0.5 falls round after round toward the median norm; each round's clip and the
    final model equal the keyed replay's (the count's noise and the updates' are keyed by
    the run's noise key)."""
    from thrift_trainer.training.privacy.mechanism import global_norm

    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    cluster.start_coordinator(2)
    rounds = 6
    private = ["privacy.clip=4.0", "privacy.noise_multiplier=0.05", "privacy.delta=0.001",
               "privacy.adaptive_clip_quantile=0.5", "privacy.clip_learning_rate=0.5",
               "privacy.clip_count_stddev=0.5", "clients.per_round=6", f"run.rounds={rounds}"]
    result = cluster.train_json(*FEDERATED, *_with_sets(private))
    run_dir = _run_dir(cluster, result)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    clips = [row["clip"] for row in rows]
    lines = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
             .splitlines()]

    def clients_of(round_index: int):
        return [(line["client"], SHIPPED) for line in lines
                if line["round"] == round_index and "node" in line]
    replayed_clips, medians = [], []

    def watch(round_index: int, algorithm, results) -> None:
        replayed_clips.append(algorithm.privacy_figures()["clip"])
        medians.append(float(np.median([global_norm(r.update) for r in results])))
    expected = _replay([*_overrides(), *private], rounds, clients_of, watch=watch,
                       noise_key=noise_key(run_dir))
    assert clips == pytest.approx(replayed_clips, rel=1e-9), (clips, replayed_clips)
    assert clips[0] == 4.0 and clips[1] < clips[0]
    # toward the median: about 0.46 of the first distance without noise; the count's noise
    # (keyed by a fresh key each run) moves the last clip by about 10 %, so allow 0.8
    assert abs(np.log(clips[-1] / medians[-1])) < 0.8 * abs(np.log(clips[0] / medians[0])), \
        (clips, medians)
    weights, _ = load_model(run_dir / "model.npz")
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_client_announced_after_round_1_is_never_sampled_by_a_private_run(cluster):
    """A node silent at the run check comes back with a client of its own: a run without
    privacy would draw it, a private one keeps to the roster its q was computed from."""
    from thrift_trainer.training.clients.settings import ClientsSettings

    roots = {key: cluster.workdir / f"data_{key}" for key in "ac"}
    _sites(roots["a"], {"ward-1": (range(1, 2), lambda label: True),
                        "ward-2": (range(2, 3), lambda label: True)})
    _sites(roots["c"], {"ward-9": (range(3, 4), lambda label: True)})
    cluster.add_node(0.0, "--data-root", str(roots["a"]), "--slowdown", "4", *SITES_PLUGIN)
    late = cluster.add_node(0.0, "--data-root", str(roots["c"]), *SITES_PLUGIN)
    late.stop()  # listed, but silent at the run check: its client is asked for later
    cluster.start_coordinator(2, "--data-root", str(roots["a"]), *SITES_PLUGIN)
    rounds = 30
    private = ["privacy.clip=0.5", "privacy.noise_multiplier=1.1", "privacy.delta=0.001",
               "clients.sampling=poisson", "clients.per_round=1", f"run.rounds={rounds}"]
    client = cluster.start_client(*_with_sets(SITES + private), "--json")
    try:
        cluster.coordinator.wait_for(r"round 1/30", timeout=60)
        back = local_cluster.start("compute_node.py", [
            str(late.port), "0.0", "--host", "127.0.0.1", "--data-root", str(roots["c"]),
            *SITES_PLUGIN], cluster.workdir, "late-back")
        cluster.nodes.append(back)
        cluster.coordinator.wait_for(r"clients ward-9 announced after round 1 are not "
                                     r"sampled", timeout=60)
        out, err = client.communicate(timeout=150)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    result = json.loads(out)
    run_dir = _run_dir(cluster, result)
    lines = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
             .splitlines()]
    roster = ["ward-1", "ward-2"]
    settings = ClientsSettings(per_round=1, sampling="poisson", placement="nodes")
    key = noise_key(run_dir)
    for r in range(1, rounds + 1):  # drawn among the two, as before the late node came
        assert sorted(line["client"] for line in lines if line["round"] == r) == \
            settings.sampled(r, 1, roster, key), (r, lines)
    assert json.loads((run_dir / "partition.json").read_text())["names"] == roster
    spent = dp_accounting.rdp.RdpAccountant()
    spent.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        1 / 2, dp_accounting.GaussianDpEvent(1.1)), rounds))
    assert float(f"{result['history'][-1]['epsilon']:.3g}") == \
        float(f"{spent.get_epsilon(0.001):.3g}")


BUFFER = 3
BUFFERED = ["--set", "schedule.mode=buffered", "--set", f"schedule.buffer_size={BUFFER}",
            "--set", "schedule.updates_per_round=1"]
FIXED_NOISE = ["--set", "privacy.clip=0.5", "--set", "privacy.noise_multiplier=1.1",
               "--set", "privacy.delta=0.001"]


def _buffered_epsilons(releases: int) -> list[float]:
    """dp-accounting's epsilon after each buffered release: a Gaussian of multiplier z / 2
    under replace-one, no sampling amplification."""
    spent = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    epsilons = []
    for _ in range(releases):
        spent.compose(dp_accounting.GaussianDpEvent(1.1 / 2))
        epsilons.append(spent.get_epsilon(0.001))
    return epsilons


def _three_digits(values: list[float]) -> list[float]:
    return [float(f"{value:.3g}") for value in values]


def _kept_clients(run_dir) -> dict[int, list[str]]:
    """Each round's clients whose result went into its version (kept: they name a node
    and no error)."""
    kept: dict[int, list[str]] = {}
    for line in (run_dir / "clients.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "node" in row and not row.get("error") and not row.get("dropped"):
            kept.setdefault(row["round"], []).append(row["client"])
    return kept


def test_a_private_buffered_run_reports_dp_accountings_epsilon_after_every_release(cluster):
    """Each buffer is one release: epsilon after every round equals dp-accounting's for as
    many Gaussian releases, and every buffer holds as many different clients as its size."""
    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    cluster.start_coordinator(2)
    releases = 4
    result = cluster.train_json(*FEDERATED, *FIXED_NOISE, *BUFFERED,
                                "--set", f"run.rounds={releases}")
    history = [row["epsilon"] for row in result["history"]]
    assert _three_digits(history) == _three_digits(_buffered_epsilons(releases)), history
    run_dir = _run_dir(cluster, result)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["epsilon"] for row in rows] == history
    kept = _kept_clients(run_dir)
    assert sorted(kept) == list(range(1, releases + 1))
    for round_index, clients in kept.items():
        assert len(clients) == BUFFER and len(set(clients)) == BUFFER, (round_index, kept)


def test_a_private_buffered_run_killed_and_resumed_counts_each_release_once(cluster):
    """A coordinator killed mid-run resumes after its last checkpointed release: each
    round (release) is in the run's metrics once, with dp-accounting's epsilon for the
    releases up to it, and the run ends."""
    releases = 6
    sets = [*FEDERATED, *FIXED_NOISE, *BUFFERED, "--set", f"run.rounds={releases}"]
    _, rows, attached = _killed_in_round_3_and_resumed(cluster, sets, releases)
    assert _three_digits([row["epsilon"] for row in rows]) == \
        _three_digits(_buffered_epsilons(releases))
    assert json.loads(attached.stdout)["clients"]["epsilon"] == rows[-1]["epsilon"]


def _killed_in_round_3_and_resumed(cluster, sets: list[str], rounds: int
                                   ) -> tuple[Path, list[dict], subprocess.CompletedProcess]:
    """Train ``sets`` through two nodes of six clients each; SIGKILL the coordinator once
    round 2 is scored (stored or not yet), resume the run and attach to it until it ends.
    The run's folder, its metrics rows (checked to hold each round once) and the attach."""
    cluster.add_node(0.0, "--clients", "0-5", "--slowdown", "3")
    cluster.add_node(0.0, "--clients", "6-11", "--slowdown", "3")
    cluster.start_coordinator(2)
    client = cluster.start_client(*sets, "--run-id", "private", "--quiet", "--dead-after", "3")
    try:
        cluster.coordinator.wait_for(rf"round 2/{rounds}", timeout=120)
        cluster.coordinator.kill()
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 1 and "--resume private" in err, err
    cluster.coordinator = local_cluster.start_coordinator(
        cluster.workdir, cluster.workdir / "compute_nodes.txt", 2, "--resume", "private")
    attached = local_cluster.run_client(["attach", "127.0.0.1",
                                         str(cluster.coordinator.port), "private", "--json",
                                         "--poll", "0.2"], cluster.workdir, timeout=300)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    resumed_after = int(cluster.coordinator.wait_for(r"resumes after round (\d+)").group(1))
    assert 1 <= resumed_after < rounds
    run_dir = cluster.workdir / "runs" / "private"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(1, rounds + 1))
    return run_dir, rows, attached
