"""The one place that loads the Thrift-generated code (gen-py/trainer_rpc/).

Everything else imports the generated modules from here. They are the package
thrift_trainer.trainer_rpc: inside an installed distribution, and reached through
thrift_trainer's path in a clone of the repository (thrift_trainer/__init__.py).
"""

from thrift_trainer.trainer_rpc import ComputeNode, Coordinator, constants, ttypes

PROTOCOL_VERSION: int = constants.PROTOCOL_VERSION

__all__ = ["ComputeNode", "Coordinator", "constants", "ttypes", "PROTOCOL_VERSION"]
