"""Plug-ins: what a process allows (--plugins, --plugin-dir, entry points), how a name
``module:attribute`` resolves, and the one-line messages of what cannot be used."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from thrift_trainer.training import plugins
from thrift_trainer.training.plugins import PluginError

MODELS = """
__version__ = "1.2"

def factory():
    return "built"

class Outer:
    class Inner:
        pass
"""


def test_plugin_names_are_module_colon_attribute() -> None:
    assert plugins.is_plugin_name("my_models:Net")
    assert plugins.is_plugin_name("pkg.sub:Outer.Inner")
    for name in ("mlp", "mlp_classifier", ":Net", "my_models:", "letters"):
        assert not plugins.is_plugin_name(name), name


def test_an_allowed_module_resolves_to_its_attributes(plugin_module) -> None:
    folder = plugin_module("my_models", MODELS)
    assert plugins.allow(["my_models", " "], folder) == ["my_models"]
    assert plugins.resolve("my_models:factory", "model")() == "built"
    assert plugins.resolve("my_models:Outer", "data set").__name__ == "Outer"
    assert "my_models" in plugins.allowed_modules()
    assert plugins.versions()["my_models"] == "1.2"


def test_a_module_not_allowed_is_refused_with_the_flag_and_never_imported(
        plugin_module) -> None:
    folder = plugin_module("secret_models", MODELS)
    sys.path.insert(0, str(folder))  # importable, but not allowed
    with pytest.raises(PluginError) as refused:
        plugins.resolve("secret_models:factory", "model")
    assert str(refused.value) == ("lacks plug-in secret_models: it allows no plug-in module; "
                                  "start it with --plugins secret_models")
    assert "secret_models" not in sys.modules
    with pytest.raises(PluginError, match="--plugins pkg$"):
        plugins.resolve("pkg.sub:factory", "model")  # the flag names the top package


def test_a_package_allows_its_submodules(plugin_module) -> None:
    folder = plugin_module("placeholder", "")
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "models.py").write_text(MODELS)
    plugins.allow(["mypkg"], folder)
    assert plugins.resolve("mypkg.models:factory", "model")() == "built"


def test_a_missing_attribute_names_the_plugin_and_the_attribute(plugin_module) -> None:
    plugins.allow(["my_models"], plugin_module("my_models", MODELS))
    with pytest.raises(PluginError) as missing:
        plugins.resolve("my_models:Nope", "model")
    assert str(missing.value) == ("this process refuses model my_models:Nope: a run may name "
                                  "only a model my_models defines itself (factory); my_models "
                                  "has no attribute 'Nope'")
    with pytest.raises(PluginError, match="not a plug-in name"):
        plugins.resolve("my_models", "model")


# A plug-in module with what a hostile run would reach through it: what it imported (a
# module, a builtin, functions and a partial of other modules) and names of its own that
# are not models.
OWN = """
import os
from builtins import open
from functools import lru_cache, partial
from json import loads as load_json
from os import system
from subprocess import run


def make():
    return "made"


@lru_cache
def cached():
    return "cached"


def _private():
    return "private"


class Rule:
    pass


shell = partial(os.system, "true")
instance = Rule()
CONSTANT = 3
"""


@pytest.mark.parametrize(("name", "kind", "reason"), [
    ("own:os.system", "model", "not a dotted path"),
    ("own:make.__globals__", "model", "not a dotted path"),
    ("own:system", "model", "system is defined in posix, not by own"),
    ("own:run", "model", "run is defined in subprocess, not by own"),
    ("own:open", "model", "open is defined in io, not by own"),
    ("own:load_json", "model", "load_json is defined in json, not by own"),
    ("own:shell", "model", "shell is defined in functools, not by own"),
    ("own:os", "model", "os is a module it imports"),
    ("own:__builtins__", "model", "not a private or special name"),
    ("own:_private", "model", "not a private or special name"),
    ("own:print", "model", "own has no attribute 'print'"),
    ("own:a-b", "model", "'a-b' is not a Python name"),
    ("own:CONSTANT", "model", "CONSTANT is an int, not an nn.Module class or a function"),
    ("own:Rule", "model", "Rule is a class, not an nn.Module class or a function"),
    ("own:instance", "model", "instance is a Rule, not an nn.Module class or a function"),
    ("own:make", "codec", "make is a function, not a class"),
    ("own:Rule", "loss", "Rule is a class, not a function"),
])
def test_a_run_may_name_only_what_the_module_defines_itself_of_that_kind(
        plugin_module, name, kind, reason) -> None:
    plugins.allow(["own"], plugin_module("own", OWN))
    allows = {"model": "make, cached", "codec": "Rule", "loss": "make, cached"}[kind]
    with pytest.raises(PluginError) as refused:
        plugins.resolve(name, kind)
    assert str(refused.value) == (f"this process refuses {kind} {name}: a run may name only a "
                                  f"{kind} own defines itself ({allows}); {reason}")


def test_what_the_module_defines_resolves_decorated_or_not(plugin_module) -> None:
    plugins.allow(["own"], plugin_module("own", OWN))
    assert plugins.resolve("own:make", "model")() == "made"
    assert plugins.resolve("own:cached", "metric")() == "cached"  # an lru_cache wrapper
    assert plugins.resolve("own:Rule", "algorithm").__name__ == "Rule"
    assert plugins.resolve("own:Rule", "data set").__name__ == "Rule"


def test_a_package_may_name_what_its_own_modules_define_and_nothing_else(
        plugin_module) -> None:
    folder = plugin_module("placeholder", "")
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("from json import loads\n"
                                                  "from mypkg.models import factory\n")
    (folder / "mypkg" / "models.py").write_text(MODELS + "from mypkg.layers import Layer\n")
    (folder / "mypkg" / "layers.py").write_text("class Layer:\n    pass\n")
    plugins.allow(["mypkg"], folder)
    assert plugins.resolve("mypkg:factory", "model")() == "built"  # re-exported from its own
    assert plugins.resolve("mypkg.layers:Layer", "data set").__name__ == "Layer"
    with pytest.raises(PluginError, match="; loads is defined in json, not by mypkg$"):
        plugins.resolve("mypkg:loads", "model")
    with pytest.raises(PluginError, match="; Layer is defined in mypkg.layers, not by "
                                          "mypkg.models$"):
        plugins.resolve("mypkg.models:Layer", "data set")


def test_the_refusal_names_the_process_that_refuses(plugin_module) -> None:
    folder = plugin_module("own", OWN)
    parser = argparse.ArgumentParser()
    plugins.add_arguments(parser)
    args = parser.parse_args(["--plugins", "own", "--plugin-dir", str(folder)])
    assert plugins.allow_from_args(args, "relay") is None
    with pytest.raises(PluginError, match="^relay refuses model own:system: a run may name "
                                          "only a model own defines itself"):
        plugins.resolve("own:system", "model")


@pytest.mark.parametrize(("source", "message"), [
    (None, "plug-in module my_models is not found (looked in the current folder and the "
           "Python path)"),
    ("import no_such_dependency_x9\n", "plug-in module my_models cannot be imported: No "
                                       "module named 'no_such_dependency_x9'"),
    ("raise RuntimeError('broken on purpose')\n",
     "plug-in module my_models failed on import: RuntimeError: broken on purpose"),
], ids=["missing", "missing-dependency", "raises"])
def test_allow_imports_at_once_and_says_in_one_line_what_failed(plugin_module, source,
                                                                message) -> None:
    folder = plugin_module("unrelated", "")
    if source is not None:
        plugin_module("my_models", source)
    with pytest.raises(PluginError) as failed:
        plugins.allow(["my_models"], folder)
    assert str(failed.value) == message


def test_a_name_that_is_not_a_module_name_is_refused(plugin_module) -> None:
    folder = plugin_module("unrelated", "")
    with pytest.raises(PluginError, match="'../evil' is not a Python module name"):
        plugins.allow(["../evil"], folder)


def test_a_plain_file_is_versioned_by_its_source(plugin_module) -> None:
    folder = plugin_module("plain", "VALUE = 1\n")
    plugins.allow(["plain"], folder)
    version = plugins.versions()["plain"]
    assert version.startswith("sha256:")
    (folder / "plain.py").write_text("VALUE = 2\n")
    # edited after its import: the process still runs, and reports, the code it imported
    assert plugins.module_version(sys.modules["plain"]) == version
    import importlib

    importlib.reload(sys.modules["plain"])  # ... until it imports it again
    assert plugins.module_version(sys.modules["plain"]) != version


def test_a_typo_names_what_is_allowed_the_near_name_and_a_flag_keeping_the_others(
        plugin_module) -> None:
    """Taken literally, the hint must not drop the modules the process already allows."""
    plugins.allow(["my_models"], plugin_module("my_models", MODELS))
    plugins.allow(["my_data"], plugin_module("my_data", MODELS))
    with pytest.raises(PluginError) as refused:
        plugins.resolve("my_modle:factory", "model")
    assert str(refused.value) == (
        "lacks plug-in my_modle: it allows my_data, my_models (did you mean my_models?); "
        "start it with --plugins my_models,my_data,my_modle")
    with pytest.raises(PluginError, match=r"it allows my_data, my_models; start it with "
                                          r"--plugins my_models,my_data,other_code$"):
        plugins.resolve("other_code:factory", "model")  # nothing near: no suggestion


def test_a_child_process_allows_what_its_parent_allowed(plugin_module) -> None:
    folder = plugin_module("my_models", MODELS)
    plugins.allow(["my_models"], folder)
    state = plugins.startup()
    assert state == (("my_models",), (str(folder.resolve()),))
    plugins.reset()
    with pytest.raises(PluginError, match="lacks plug-in my_models"):
        plugins.resolve("my_models:factory", "model")
    plugins.allow_again(state)
    assert plugins.resolve("my_models:factory", "model")() == "built"


def test_the_command_line_flags(plugin_module, tmp_path: Path) -> None:
    folder = plugin_module("my_models", MODELS)
    parser = argparse.ArgumentParser()
    plugins.add_arguments(parser)
    args = parser.parse_args(["--plugins", "my_models", "--plugin-dir", str(folder)])
    assert plugins.allow_from_args(args) is None
    assert plugins.resolve("my_models:factory", "model")() == "built"
    missing = parser.parse_args(["--plugins", "my_models", "--plugin-dir",
                                 str(tmp_path / "nowhere")])
    assert plugins.allow_from_args(missing) == f"--plugin-dir {tmp_path / 'nowhere'} is not " \
                                               "a folder"
    absent = parser.parse_args(["--plugins", "absent_models", "--plugin-dir", str(folder)])
    assert "plug-in module absent_models is not found" in plugins.allow_from_args(absent)


def test_an_installed_package_allows_its_modules_by_entry_point(plugin_module) -> None:
    """A distribution advertising a module in the entry-point group is allowed without
    --plugins (a fake distribution on the path, as pip would install it)."""
    folder = plugin_module("advertised_models", MODELS)
    info = folder / "advertised_models-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: advertised-models\n"
                                   "Version: 0.3\n")
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n"
                                           "advertised_models = advertised_models\n")
    sys.path.insert(0, str(folder))
    assert "advertised_models" in plugins.allowed_modules()
    assert plugins.resolve("advertised_models:factory", "model")() == "built"
