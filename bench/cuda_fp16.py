"""fp16 with a loss scaler on a GPU: a node's local training (delta_avg, clipped) and a
unit's mean gradient (sync_sgd) stay finite. The suite cannot run it (no GPU); run it on a
machine with one:

    python bench/cuda_fp16.py          # exit 0: both finite; 1: not; 2: no GPU here
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from thrift_trainer.training.data.datasets import load_data  # noqa: E402
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT  # noqa: E402
from thrift_trainer.training.data.settings import DataSettings  # noqa: E402
from thrift_trainer.training.models import objectives  # noqa: E402
from thrift_trainer.training.models.module_training import (  # noqa: E402
    LocalSteps,
    ModelSetup,
    mean_gradients,
    train_locally,
)
from thrift_trainer.training.models.settings import ModelSettings  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU here: fp16 trains on CUDA only", file=sys.stderr)
        return 2
    data = load_data("letters", DEFAULT_DATA_ROOT / "letters",
                     DataSettings.from_mapping({"format": "letters"}))
    setup = ModelSetup("mlp_classifier",
                       ModelSettings({"hidden": [8]}, precision="fp16", clip_norm=1.0), data,
                       objectives.cross_entropy, objectives.error_rate)
    state, loss = train_locally(setup, setup.build(seed=4).to("cuda"), np.arange(0, 256),
                                LocalSteps("adam", lr=0.01, batch_size=32, epochs=1),
                                device="cuda")
    update, _ = mean_gradients(setup, setup.build(seed=4).to("cuda"), 0, 64, batch_size=16,
                               device="cuda")
    finite = math.isfinite(loss) and all(np.all(np.isfinite(v)) for v in
                                         [*state.values(), *update.values()])
    print(f"fp16 local training loss {loss:.4f}; every tensor finite: {finite}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
