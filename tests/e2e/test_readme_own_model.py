"""The README's "Train your own model" section, run as a user would: its module, its
commands (on free ports), and its model file loaded with plain torch."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import torch

from devtools.local_cluster import REPO

SECTION = "## Train your own model"


def _section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    return text[start:text.index("\n## ", start + len(SECTION))]


def _commands(section: str) -> dict[str, list[str]]:
    """The three commands of the section's shell block, by script, as argument lists."""
    block = re.search(r"```\n(python .*?)```", section, re.S).group(1).replace("\\\n", " ")
    commands = {}
    for line in block.splitlines():
        words = shlex.split(line.partition("#")[0])
        if words and words[0] == "python":
            commands[words[1]] = words[2:]
    return commands


def test_the_readme_example_trains_its_own_model_and_torch_loads_the_result(cluster):
    section = _section()
    module_code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (cluster.workdir / "my_models.py").write_text(module_code, encoding="utf-8")
    commands = _commands(section)
    node_options = commands["compute_node.py"][2:]  # after <port> <load_prob>
    assert node_options == ["--plugins", "my_models"]
    for _ in range(2):
        cluster.add_node(0.0, *node_options)
    cluster.start_coordinator(2, *commands["coordinator_node.py"][2:])
    client_args = commands["client.py"][2:]  # after <coordinator_ip> <port>
    result = cluster.train_json(*client_args, timeout=300)

    assert result["rounds"] == 20
    assert result["validation_error"] < 0.5, result["history"]  # 0.9 before training
    run_dir = Path(result["coordinator_run_dir"])
    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("readme_models", cluster.workdir /
                                                  "my_models.py")
    models = importlib.util.module_from_spec(spec)
    sys.modules["readme_models"] = models
    try:
        spec.loader.exec_module(models)
        model = models.SmallCNN()
        model.load_state_dict(load_file(run_dir / "model.safetensors"), strict=True)
        model.eval()
        with torch.no_grad():
            assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    finally:
        sys.modules.pop("readme_models", None)
