"""Federated clients as data: a client is a named piece of a data set.

Pure building blocks, the same on every process given the same seed:

- `partition`: partitioners, (labels, client count, seed, their own parameter) -> one
  sorted index array per client (iid, dirichlet, shards, classes, quantity, plug-ins).
- `fingerprint`: a partition's sha256 and its record (sizes, label counts) for the run
  folder, so that every process can tell it holds the same partition.
- `sampling`: which clients take part in a round, a function of (round, seed, available).
- `synthetic`: FedProx's Synthetic(alpha, beta) data, per device.
- `roster`: the clients as an algorithm's coordinator half plans them (sizes, a round's
  units, the count it closes at), and a client's batch for one round.
"""

from thrift_trainer.training.clients.errors import ClientsError

__all__ = ["ClientsError"]
