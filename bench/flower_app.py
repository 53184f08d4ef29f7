"""The Flower side of bench/flower_compare.py, and the plain in-process FedAvg loop.

Imports only numpy and torch at the top (and flwr inside the Flower functions), so that
the bench's own interpreter imports it for the in-process floor and Flower's virtual
environment (bench/.venvs/flower) runs it as a script:

    bench/.venvs/flower/bin/python bench/flower_app.py EXPERIMENT.npz OUT.json

The experiment file (written by bench/flower_compare.py from the project's own loader,
partitioner, sampler and initial weights) holds the letters arrays, each client's example
indices, the clients asked in each round, each (round, client)'s shuffle seed, the initial
weights and E, B, the learning rate. Local training replicates the project's
(training/models/module_training.py `train_locally`): plain SGD on ``mlp_classifier``
(Flatten, Linear(16, 64), ReLU, Linear(64, 26)), cross-entropy, E passes over the client's
examples in the order numpy's default_rng(seed).permutation gives, batches of B.

Under Flower (1.x, Message API, Ray backend via ``flwr.simulation.run_simulation``): one
simulated SuperNode per client; each node's ClientApp trains the partition its node
config names (``partition-id``). Before round 1 the ServerApp asks every node its
partition id (a QUERY message), so that its FedAvg, a subclass of
``flwr.serverapp.strategy.FedAvg`` whose ``configure_train`` sends the round's message to
the nodes of the clients the project sampled, trains the very same clients. Its central
evaluation (``evaluate_fn``) scores the validation part after every round, as the
project's coordinator does, and stamps the time.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

EVAL_BATCH = 256  # the project's evaluate() batch


@dataclass
class Experiment:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    parts: list[np.ndarray]  # each client's example indices
    names: list[str]  # the model's state names, in order
    weights: list[np.ndarray]  # initial weights, in that order
    clients: np.ndarray  # (rounds, per_round): the clients asked in each round
    seeds: np.ndarray  # (rounds, clients): the shuffle seed of each (round, client)
    epochs: int
    batch: int
    lr: float
    hidden: int

    @property
    def rounds(self) -> int:
        return int(self.clients.shape[0])


def save_experiment(path: Path, *, x_train: np.ndarray, y_train: np.ndarray,
                    x_val: np.ndarray, y_val: np.ndarray, parts: list[np.ndarray],
                    weights: dict[str, np.ndarray], clients: np.ndarray, seeds: np.ndarray,
                    epochs: int, batch: int, lr: float, hidden: int) -> None:
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    names = list(weights)
    np.savez(path, x_train=x_train.astype(np.float32), y_train=y_train.astype(np.int64),
             x_val=x_val.astype(np.float32), y_val=y_val.astype(np.int64),
             part_indices=np.concatenate(parts).astype(np.int64), part_sizes=sizes,
             names=np.array(names), clients=clients.astype(np.int64),
             seeds=seeds.astype(np.int64),
             hyper=np.array([epochs, batch, lr, hidden], dtype=np.float64),
             **{f"w{i}": weights[name] for i, name in enumerate(names)})


_CACHE: dict[str, Experiment] = {}


def load_experiment(path: str | Path) -> Experiment:
    """The experiment file, read once per process (a Ray actor serves many messages)."""
    key = str(path)
    if key not in _CACHE:
        with np.load(key) as f:
            cuts = np.cumsum(f["part_sizes"])[:-1]
            names = [str(n) for n in f["names"]]
            epochs, batch, lr, hidden = f["hyper"]
            _CACHE[key] = Experiment(
                torch.from_numpy(f["x_train"]), torch.from_numpy(f["y_train"]),
                torch.from_numpy(f["x_val"]), torch.from_numpy(f["y_val"]),
                np.split(f["part_indices"], cuts), names,
                [f[f"w{i}"] for i in range(len(names))], f["clients"], f["seeds"],
                int(epochs), int(batch), float(lr), int(hidden))
    return _CACHE[key]


def build_model(exp: Experiment) -> nn.Module:
    """The project's mlp_classifier on letters, in plain torch."""
    return nn.Sequential(nn.Flatten(), nn.Linear(exp.x_train.shape[1], exp.hidden), nn.ReLU(),
                         nn.Linear(exp.hidden, int(exp.y_train.max()) + 1))


def load_weights(module: nn.Module, names: list[str], arrays: list[np.ndarray]) -> None:
    state = module.state_dict()
    with torch.no_grad():
        for name, array in zip(names, arrays, strict=True):
            state[name].copy_(torch.from_numpy(np.asarray(array)))


def local_train(exp: Experiment, module: nn.Module, arrays: list[np.ndarray], client: int,
                seed: int) -> tuple[list[np.ndarray], int, float]:
    """E epochs of plain SGD on the client's examples from ``arrays``: the new weights,
    the client's examples, the mean training loss."""
    load_weights(module, exp.names, arrays)
    module.train()
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad],
                                lr=exp.lr)
    examples = exp.parts[client]
    rng = np.random.default_rng(seed)
    loss_sum = 0.0
    for _ in range(exp.epochs):
        order = examples[rng.permutation(len(examples))]
        for first in range(0, len(order), exp.batch):
            index = torch.from_numpy(order[first:first + exp.batch])
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(module(exp.x_train[index]), exp.y_train[index])
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach()) * len(index)
    state = module.state_dict()
    trained = [state[name].detach().numpy().copy() for name in exp.names]
    return trained, len(examples), loss_sum / max(exp.epochs * len(examples), 1)


@torch.no_grad()
def evaluate(exp: Experiment, module: nn.Module, arrays: list[np.ndarray]) -> tuple[float, float]:
    """(validation error, validation loss), example-weighted over batches of 256."""
    load_weights(module, exp.names, arrays)
    module.eval()
    wrong, loss_sum, total = 0.0, 0.0, len(exp.y_val)
    for first in range(0, total, EVAL_BATCH):
        inputs, targets = exp.x_val[first:first + EVAL_BATCH], exp.y_val[first:first + EVAL_BATCH]
        scores = module(inputs)
        wrong += float((scores.argmax(dim=1) != targets).sum())
        loss_sum += float(F.cross_entropy(scores, targets)) * len(targets)
    return wrong / total, loss_sum / total


def weighted_mean(results: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
    """FedAvg's aggregate: the clients' weights averaged by their examples."""
    total = sum(n for _, n in results)
    return [sum(arrays[i] * (n / total) for arrays, n in results)
            for i in range(len(results[0][0]))]


def plain_loop(path: str | Path) -> dict[str, Any]:
    """FedAvg in this process: each round, the sampled clients trained one after another
    from the round's weights, averaged, scored on the validation part. One torch thread."""
    torch.set_num_threads(1)
    exp = load_experiment(path)
    module = build_model(exp)
    arrays = list(exp.weights)
    rows, began = [], time.perf_counter()
    for round_index in range(1, exp.rounds + 1):
        start = time.perf_counter()
        results = []
        for client in exp.clients[round_index - 1]:
            trained, n, _ = local_train(exp, module, arrays, int(client),
                                        int(exp.seeds[round_index - 1, client]))
            results.append((trained, n))
        arrays = weighted_mean(results)
        error, loss = evaluate(exp, module, arrays)
        rows.append({"round": round_index, "validation_error": error, "validation_loss": loss,
                     "seconds": time.perf_counter() - start})
    return {"rounds": rows, "wall_seconds": time.perf_counter() - began,
            "final_weights": {name: a.tolist() for name, a in zip(exp.names, arrays,
                                                                  strict=True)}}


# ------------------------------------------------------------------ Flower
def flower_apps(path: str, out: str) -> tuple[Any, Any]:
    """The ServerApp and ClientApp of the experiment in ``path``; the server writes its
    per-round rows to ``out`` (JSON) at the end."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    try:
        from flwr.app import MessageType
    except ImportError:  # older releases
        from flwr.common import MessageType

    exp = load_experiment(path)
    report: dict[str, Any] = {"rounds": []}
    client_app = ClientApp()

    @client_app.query()
    def partition(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"config": ConfigRecord({"partition-id": pid})}),
                       reply_to=msg)

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        config = msg.content["config"]
        data = load_experiment(str(config["data"]))
        client = int(context.node_config["partition-id"])
        round_index = int(config["server-round"])
        module = _module_of(data)
        trained, n, loss = local_train(data, module, msg.content["arrays"].to_numpy_ndarrays(),
                                       client, int(data.seeds[round_index - 1, client]))
        content = RecordDict({"arrays": ArrayRecord(numpy_ndarrays=trained),
                              "metrics": MetricRecord({"num-examples": n, "train_loss": loss})})
        return Message(content, reply_to=msg)

    class SameClients(FedAvg):
        """FedAvg that trains the nodes of the clients the project sampled."""

        def __init__(self, node_of: dict[int, int], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.node_of = node_of

        def configure_train(self, server_round: int, arrays: ArrayRecord,
                            config: ConfigRecord, grid: Grid) -> list[Message]:
            config["server-round"] = server_round
            record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
            nodes = [self.node_of[int(c)] for c in exp.clients[server_round - 1]]
            return list(self._construct_messages(record, nodes, MessageType.TRAIN))

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.set_num_threads(1)
        began = time.perf_counter()
        node_of: dict[int, int] = {}
        asked_nodes: set[int] = set()
        while len(node_of) < len(exp.parts):  # nodes may still be registering
            if time.perf_counter() - began > 600:
                raise RuntimeError(f"{len(node_of)} of {len(exp.parts)} nodes answered")
            new = [node for node in grid.get_node_ids() if node not in asked_nodes]
            if not new:
                time.sleep(0.2)
                continue
            asked_nodes.update(new)
            asked = [Message(RecordDict(), dst_node_id=node, message_type=MessageType.QUERY)
                     for node in new]
            for reply in grid.send_and_receive(asked):
                if reply.has_error():
                    raise RuntimeError(f"node {reply.metadata.src_node_id}: "
                                       f"{reply.error.reason}")
                node_of[int(reply.content["config"]["partition-id"])] = \
                    reply.metadata.src_node_id
        report["query_seconds"] = time.perf_counter() - began
        module = build_model(exp)
        stamps: list[float] = []

        def central(round_index: int, arrays: ArrayRecord) -> MetricRecord:
            stamps.append(time.perf_counter())
            error, loss = evaluate(exp, module, arrays.to_numpy_ndarrays())
            if round_index:
                report["rounds"].append({"round": round_index, "validation_error": error,
                                         "validation_loss": loss,
                                         "seconds": stamps[-1] - stamps[-2]})
            return MetricRecord({"validation_error": error})

        strategy = SameClients(node_of, fraction_train=exp.clients.shape[1] / len(exp.parts),
                               fraction_evaluate=0.0, min_available_nodes=len(exp.parts))
        strategy.start(grid, ArrayRecord(numpy_ndarrays=list(exp.weights)),
                       num_rounds=exp.rounds, train_config=ConfigRecord({"data": path}),
                       evaluate_fn=central)
        # the last round's time: its training and its own evaluation
        last = time.perf_counter()
        if report["rounds"]:
            report["rounds"][-1]["seconds"] = last - stamps[-2]
        Path(out).write_text(json.dumps(report, indent=2) + "\n")

    return server_app, client_app


_MODULES: dict[int, nn.Module] = {}


def _module_of(exp: Experiment) -> nn.Module:
    """One module per process (a Ray actor), its weights overwritten for each message."""
    if id(exp) not in _MODULES:
        _MODULES[id(exp)] = build_model(exp)
    return _MODULES[id(exp)]


def run_flower(path: str, out: str, cpus: int, cpus_per_client: float) -> None:
    """The experiment under Flower's simulation (Ray backend); its rows to ``out``."""
    import flwr
    import ray
    from flwr.simulation import run_simulation

    began = time.perf_counter()
    server_app, client_app = flower_apps(path, out)
    exp = load_experiment(path)
    run_simulation(server_app=server_app, client_app=client_app,
                   num_supernodes=len(exp.parts),
                   backend_config={"client_resources": {"num_cpus": cpus_per_client,
                                                        "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus}})
    report = json.loads(Path(out).read_text())
    report.update(wall_seconds=time.perf_counter() - began, flwr=flwr.__version__,
                  ray=ray.__version__, torch=torch.__version__,
                  python=sys.version.split()[0])
    Path(out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # Ray's workers import us
    import flower_app  # noqa: PLW0406  # the module by its name, which Ray's workers share

    flower_app.run_flower(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3
                          else 2, float(sys.argv[4]) if len(sys.argv) > 4 else 1.0)
