"""delta_avg's units and coordinator model, by kind of model: the letters MLP (one unit per
``train_*`` file, numpy), any torch model (index ranges of its training part, its
state and server optimizer in training/algorithms/torch_model.py), and a torch model
trained on federated clients (one unit per client sampled for the round)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from thrift_trainer.training import server_optim
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.letters_files import train_files, validation_data
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.models import mlp
from thrift_trainer.training.units import EVALUATE, RoundEval, TensorSpecs, UnitSpec, Weights

EVAL_PREFIX = "eval-"  # an evaluation unit's id: eval-<client>, apart from its training


class LettersPlan:
    """The letters MLP's units (one per `train_*` file) and its validation file."""

    def __init__(self, spec: mlp.MLPSpec, dataset_dir: Path) -> None:
        self.spec = spec
        files = _unit_files(dataset_dir)
        self.units = [UnitSpec(unit_id=name, unit_path=name) for name in files]
        # Rows of each unit file: the most samples a node's result for it may count.
        self.rows = {name: len(load_letters(dataset_dir / name)[1]) for name in files}
        self.validation = validation_data(dataset_dir)

    def initial_weights(self, seed: int) -> Weights:
        return mlp.init_params(self.spec, seed=seed)

    def samples(self, unit: UnitSpec) -> int | None:
        return self.rows.get(unit.unit_path)

    def evaluate(self, weights: Weights) -> RoundEval:
        error, loss = mlp.evaluate(weights, *self.validation, self.spec)
        return RoundEval(validation_error=float(error), validation_loss=float(loss))

    def description(self) -> dict[str, Any]:
        return {"model": "mlp", "spec": self.spec.to_dict()}


class RangePlan:
    """A torch model's units (`units` index ranges of the training part) and its state on
    the coordinator (training/algorithms/torch_model.py)."""

    def __init__(self, config: Mapping[str, Any], optimizer: server_optim.ServerOptimizer,
                 model: str, dataset: str, dataset_dir: Path) -> None:
        from thrift_trainer.training.algorithms import torch_model  # torch only for torch models

        self.state = torch_model.LocalState(
            torch_model.setup_of(model, config, dataset, dataset_dir), config["seed"],
            config["batch_size"], optimizer)
        ranges = torch_model.unit_ranges(len(self.state.setup.data.train), config["units"])
        self.units = [UnitSpec(unit_id=f"shard{k}-{lo}-{hi}", unit_path="", index_start=lo,
                               index_stop=hi) for k, (lo, hi) in enumerate(ranges)]

    def initial_weights(self, seed: int) -> Weights:
        return self.state.weights()

    def samples(self, unit: UnitSpec) -> int | None:
        if unit.index_start is None or unit.index_stop is None:
            return None
        return unit.index_stop - unit.index_start

    def evaluate(self, weights: Weights) -> RoundEval:
        return self.state.evaluate(weights)

    def description(self) -> dict[str, Any]:
        return self.state.description()

    def expected_update(self, weights: Weights) -> TensorSpecs:
        from thrift_trainer.training.algorithms import torch_model

        return torch_model.expected_update(self.state.module, weights, gradients=False)

    def round_units(self, round_index: int) -> list[UnitSpec]:
        return list(self.units)

    def quorum(self, units: int) -> int:
        return units


class ClientPlan(RangePlan):
    """A torch model on federated clients: the training part dealt to the clients by the
    run's partition (computed here as on every node, training/clients/data_parts.py), one
    unit per client sampled for a round, weighed by the client's examples."""

    def __init__(self, config: Mapping[str, Any], optimizer: server_optim.ServerOptimizer,
                 model: str, dataset: str, dataset_dir: Path,
                 clients: ClientsSettings) -> None:
        from thrift_trainer.training.clients.data_parts import parts_of

        super().__init__(config, optimizer, model, dataset, dataset_dir)
        self.clients, self.seed = clients, config["seed"]
        # a private run's noise key (its draws are keyed by it); None: drawn by the seed
        self.noise_key: Callable[[], bytes | None] = lambda: None
        self.record = PartitionRecord("nodes", self.seed, "", [])
        self._set_sizes({})
        if not clients.on_nodes:  # node-resident clients are known once nodes announce them
            parts, self.record = parts_of(self.state.setup, clients, self.seed)
            self._set_sizes({name: len(part) for name, part in zip(clients.names(), parts,
                                                                   strict=True)})

    def _set_sizes(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        # a client with no example has nothing to train (a plug-in rule may leave one)
        self.units = [UnitSpec(unit_id=name, unit_path="", client=name)
                      for name, size in self.sizes.items() if size]
        self._by_name = {unit.unit_id: unit for unit in self.units}

    def take_clients(self, sizes: dict[str, int],
                     labels: dict[str, dict[int, int] | None]) -> PartitionRecord:
        """Node-resident clients as their nodes announced them (name -> examples, and label
        counts where they were given); returns their record."""
        names = sorted(sizes)
        self._set_sizes({name: sizes[name] for name in names})
        self.record = PartitionRecord("nodes", self.seed, "", [sizes[n] for n in names],
                                      [labels.get(n) or {} for n in names], names=names)
        return self.record

    def round_units(self, round_index: int) -> list[UnitSpec]:
        chosen = self.clients.sampled(round_index, self.seed, list(self._by_name),
                                      self.noise_key())
        return [self._by_name[name] for name in chosen]

    def evaluation_units(self, round_index: int, rounds: int) -> list[UnitSpec]:
        """The clients scored after ``round_index`` of ``rounds`` (clients.eval_every),
        among those with a validation part, each as an evaluation unit; none when the
        round is not due."""
        if not self.clients.evaluates(round_index, rounds):
            return []
        held = self.record.validation_sizes
        scored = [name for k, name in enumerate(self.clients.names())
                  if k < len(held) and held[k]] if held else list(self._by_name)
        return [UnitSpec(unit_id=EVAL_PREFIX + name, unit_path="", client=name,
                         kind=EVALUATE)
                for name in self.clients.evaluated(round_index, self.seed, scored)]

    @property
    def scores_accuracy(self) -> bool:
        settings = self.state.setup.settings
        return self.state.setup.data.shape.num_classes is not None and \
            settings.metric in ("auto", "error_rate")

    def quorum(self, units: int) -> int:
        """Over-selected rounds close at the target count; the late units are cancelled.
        A Poisson round waits for every client it drew, however many."""
        if self.clients.poisson:
            return units
        return min(units, self.clients.target(len(self.units)))

    def samples(self, unit: UnitSpec) -> int | None:
        return self.sizes.get(unit.client or "")

    @property
    def partition(self) -> PartitionRecord:
        return self.record




def _unit_files(dataset_dir: Path) -> list[str]:
    """The `train_*` files, in natural order (train_letters2 before train_letters10)."""
    files = [p.name for p in train_files(dataset_dir)]
    if not files:
        raise ConfigError(f"no train_* files in {dataset_dir}: each one is a work unit")
    return files
