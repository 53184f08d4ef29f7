"""The Flower side of bench/secure_aggregation.py: Flower's own SecAgg+ against its plain
FedAvg, numpy clients only (no torch), in Flower's simulation engine.

Run from Flower's virtual environment (bench/.venvs/flower-secagg), never the project's:

    bench/.venvs/flower-secagg/bin/python bench/flower_secagg_app.py SETTINGS.json OUT.json
    bench/.venvs/flower-secagg/bin/python bench/flower_secagg_app.py --primitives 10,100 \
        100000,1000000 OUT.json

SETTINGS.json: ``clients`` (SuperNodes, all of them trained every round), ``rounds``,
``secure`` (false: plain FedAvg), ``num_shares`` and ``reconstruction_threshold``
(SecAggPlusWorkflow's), ``clipping_range``, ``quantization_range``, ``modulus_range``,
``max_weight``, ``data`` (the letters folder), ``count`` (how many parts the training part
is dealt into; client i trains part i), ``hidden``, ``epochs``, ``batch``, ``lr``, ``seed``.

Each client trains the project's ``mlp_classifier`` shape (16-hidden-26, the same
parameter count) in numpy: E epochs of plain SGD on cross-entropy over its part, batches
of B. The ServerApp runs Flower's ``DefaultWorkflow`` with a legacy ``FedAvg`` (every node
every round, no federated evaluation), its fit step ``SecAggPlusWorkflow`` when
``secure``, the ClientApp carrying ``secaggplus_mod``. Measured: each round's end (the
central ``evaluate_fn``'s stamp; round r's time is the gap since round r - 1's), the
seconds of each SecAgg+ stage per round (the workflow's four stage methods, timed), and
the bytes of every message's content both ways (the grid's ``send_and_receive``, each
message's RecordDict as Flower's protobuf; the simulation moves Python objects, so this is
what the messages would weigh on the wire, less the envelope).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FEATURES, CLASSES = 16, 26
STAGES = ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage", "unmask_stage")


# ------------------------------------------------------------------ the numpy model
def load_letters(folder: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The letters training part: 16 integer features, then the class (0..25)."""
    files = sorted(Path(folder).glob("train_letters*.txt"))
    rows = np.concatenate([np.loadtxt(f, delimiter=",", ndmin=2) for f in files])
    return (rows[:, :FEATURES] / 15.0).astype(np.float32), rows[:, FEATURES].astype(np.int64)


def initial_weights(hidden: int, seed: int) -> list[np.ndarray]:
    """W1 (hidden x 16), b1, W2 (26 x hidden), b2: 16h + h + 26h + 26 parameters."""
    rng = np.random.default_rng(seed)
    bound1, bound2 = 1 / np.sqrt(FEATURES), 1 / np.sqrt(hidden)
    return [rng.uniform(-bound1, bound1, (hidden, FEATURES)).astype(np.float32),
            rng.uniform(-bound1, bound1, hidden).astype(np.float32),
            rng.uniform(-bound2, bound2, (CLASSES, hidden)).astype(np.float32),
            rng.uniform(-bound2, bound2, CLASSES).astype(np.float32)]


def sgd(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray, epochs: int, batch: int,
        lr: float, seed: int) -> list[np.ndarray]:
    """Plain SGD on softmax cross-entropy; returns new weights."""
    w1, b1, w2, b2 = (w.copy() for w in weights)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            xb, yb = x[idx], y[idx]
            h = np.maximum(xb @ w1.T + b1, 0)
            logits = h @ w2.T + b2
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(yb)), yb] -= 1
            p /= len(yb)
            dh = (p @ w2) * (h > 0)
            w2 -= lr * p.T @ h
            b2 -= lr * p.sum(axis=0)
            w1 -= lr * dh.T @ xb
            b1 -= lr * dh.sum(axis=0)
    return [w1, b1, w2, b2]


def loss_of(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    w1, b1, w2, b2 = weights
    logits = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    logits = logits - logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


# ------------------------------------------------------------------ Flower
_DATA: dict[str, Any] = {}


def _part(settings: dict[str, Any], client: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``client``'s part of the IID deal (one load per process: a Ray actor)."""
    if "x" not in _DATA:
        x, y = load_letters(settings["data"])
        order = np.random.default_rng(settings["seed"]).permutation(len(x))
        _DATA.update(x=x, y=y, parts=np.array_split(order, settings["count"]))
    idx = _DATA["parts"][client]
    return _DATA["x"][idx], _DATA["y"][idx]


def flower_apps(settings: dict[str, Any], out: str) -> tuple[Any, Any]:
    """The ServerApp and ClientApp; the server writes its measurements to ``out``."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import ndarrays_to_parameters
    from flwr.common.serde import recorddict_to_proto
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    class Trainer(NumPyClient):
        def __init__(self, client: int) -> None:
            self.client = client

        def fit(self, parameters: list[np.ndarray], config: dict) -> tuple:
            x, y = _part(settings, self.client)
            rnd = int(config.get("round", 0))
            new = sgd(parameters, x, y, settings["epochs"], settings["batch"],
                      settings["lr"], settings["seed"] * 100003 + rnd * 1009 + self.client)
            return new, len(x), {}

    def client_fn(context: Any) -> Any:
        return Trainer(int(context.node_config["partition-id"])).to_client()

    client_app = ClientApp(client_fn=client_fn,
                           mods=[secaggplus_mod] if settings["secure"] else [])
    stamps: list[float] = []
    losses: list[float] = []
    stage_seconds: list[dict[str, float]] = []
    traffic = {"sent": 0, "received": 0, "messages": 0}

    def content_bytes(message: Any) -> int:
        return recorddict_to_proto(message.content).ByteSize() if message.has_content() \
            else 0

    class CountingGrid:
        """The grid, counting what each message carries both ways."""

        def __init__(self, grid: Any) -> None:
            self._grid = grid

        def send_and_receive(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            messages = list(messages)
            traffic["sent"] += sum(content_bytes(m) for m in messages)
            replies = list(self._grid.send_and_receive(messages, *args, **kwargs))
            traffic["received"] += sum(content_bytes(m) for m in replies)
            traffic["messages"] += len(messages) + len(replies)
            return replies

        def __getattr__(self, name: str) -> Any:
            return getattr(self._grid, name)

    class TimedSecAggPlus(SecAggPlusWorkflow):
        """Flower's SecAgg+ with each stage's seconds kept per round."""

        def __call__(self, grid: Any, context: Any) -> None:
            stage_seconds.append({})
            super().__call__(grid, context)

    for stage in STAGES:
        def timed(self: Any, *args: Any, _stage: str = stage) -> Any:
            began = time.perf_counter()
            try:
                return getattr(SecAggPlusWorkflow, _stage)(self, *args)
            finally:
                stage_seconds[-1][_stage] = time.perf_counter() - began
        setattr(TimedSecAggPlus, stage, timed)

    x_all, y_all = load_letters(settings["data"])

    traffic_at: list[tuple[int, int]] = []

    def central(server_round: int, parameters: list[np.ndarray], config: dict) -> tuple:
        stamps.append(time.perf_counter())
        traffic_at.append((traffic["sent"], traffic["received"]))
        losses.append(loss_of(parameters, x_all[:2000], y_all[:2000]))
        return losses[-1], {}

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Any, context: Any) -> None:
        n = settings["clients"]
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n,
                          min_available_clients=n, evaluate_fn=central,
                          on_fit_config_fn=lambda r: {"round": r},
                          initial_parameters=ndarrays_to_parameters(
                              initial_weights(settings["hidden"], settings["seed"])))
        legacy = LegacyContext(context=context,
                               config=ServerConfig(num_rounds=settings["rounds"]),
                               strategy=strategy)
        fit = TimedSecAggPlus(
            num_shares=settings["num_shares"],
            reconstruction_threshold=settings["reconstruction_threshold"],
            max_weight=settings["max_weight"], clipping_range=settings["clipping_range"],
            quantization_range=settings["quantization_range"],
            modulus_range=settings["modulus_range"]) if settings["secure"] else None
        DefaultWorkflow(fit_workflow=fit)(CountingGrid(grid), legacy)
        rounds = [stamps[r] - stamps[r - 1] for r in range(1, len(stamps))]
        Path(out).write_text(json.dumps({
            "round_seconds": rounds, "stage_seconds": stage_seconds, "losses": losses,
            "round_bytes": [[traffic_at[r][0] - traffic_at[r - 1][0],
                             traffic_at[r][1] - traffic_at[r - 1][1]]
                            for r in range(1, len(traffic_at))],
            "bytes_sent": traffic["sent"], "bytes_received": traffic["received"],
            "messages": traffic["messages"]}, indent=2) + "\n")

    return server_app, client_app


def primitives(clients: list[int], sizes: list[int], threshold: float = 0.6) -> dict:
    """Flower's own SecAgg+ primitives in this process, as its workflow calls them on the
    complete graph (num_shares = clients, threshold round(0.6 x clients)): one client's
    Shamir split of a 32-byte secret, the server's combining of one secret, one mask
    (``pseudo_rand_gen``, modulus 2^32) per size."""
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    secret = bytes(range(32))
    rows = []
    for n in clients:
        t = max(2, round(threshold * n))
        began = time.perf_counter()
        shares = create_shares(secret, t, n)
        split_s = time.perf_counter() - began
        began = time.perf_counter()
        assert combine_shares(shares[:t]) == secret
        combine_s = time.perf_counter() - began
        rows.append({"clients": n, "threshold": t, "split_seconds": split_s,
                     "combine_seconds": combine_s})
    masks = {}
    for size in sizes:
        began = time.perf_counter()
        pseudo_rand_gen(secret, 1 << 32, [(size,)])
        masks[str(size)] = time.perf_counter() - began
    return {"shamir": rows, "mask_seconds": masks}


def run(settings_path: str, out: str) -> None:
    """One simulation of the settings in ``settings_path``; its figures to ``out``."""
    import flwr
    import ray
    from flwr.simulation import run_simulation

    settings = json.loads(Path(settings_path).read_text())
    began = time.perf_counter()
    server_app, client_app = flower_apps(settings, out)
    run_simulation(server_app=server_app, client_app=client_app,
                   num_supernodes=settings["clients"],
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": settings.get("cpus", 2)}})
    report = json.loads(Path(out).read_text())
    params = sum(w.size for w in initial_weights(settings["hidden"], settings["seed"]))
    report.update(wall_seconds=time.perf_counter() - began, flwr=flwr.__version__,
                  ray=ray.__version__, numpy=np.__version__, parameters=int(params),
                  python=sys.version.split()[0])
    Path(out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # Ray's workers import us
    import flower_secagg_app  # noqa: PLW0406  # by its name, which Ray's workers share

    if sys.argv[1] == "--primitives":  # --primitives CLIENTS SIZES OUT (comma lists)
        Path(sys.argv[4]).write_text(json.dumps(flower_secagg_app.primitives(
            [int(n) for n in sys.argv[2].split(",")],
            [int(n) for n in sys.argv[3].split(",")]), indent=2) + "\n")
    else:
        flower_secagg_app.run(sys.argv[1], sys.argv[2])
