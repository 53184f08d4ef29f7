"""The one place that loads the Thrift-generated code in gen-py/.

Everything else imports the generated modules from here, so the path trick
lives in one spot and the rest of the project never touches sys.path.
"""

import os
import sys

_GEN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gen-py")
if _GEN_PY not in sys.path:
    sys.path.insert(0, _GEN_PY)

from trainer_rpc import ComputeNode, Coordinator, constants, ttypes  # noqa: E402

PROTOCOL_VERSION: int = constants.PROTOCOL_VERSION

__all__ = ["ComputeNode", "Coordinator", "constants", "ttypes", "PROTOCOL_VERSION"]
