"""Plug-ins: code a process's operator allowed it to run, named by ``module:attribute``.

A run names a model, data set, algorithm, aggregation rule or codec that is not built in
as ``module:attribute`` (``my_models:SmallCNN``). The coordinator never sends code: each
process imports only the plug-in modules its operator named, with ``--plugins
my_models,my_data`` (modules found on the Python path or in the current folder) or by
installing a package that advertises its modules in the entry-point group
``thrift_trainer.plugins`` (as pytest finds its plug-ins). A name whose module is not
allowed is refused with the flag that would allow it, never imported.

What a process allows is set once, at start, by its command line (`allow`); the
resolution (`resolve`) and the report of loaded plug-ins with their versions (`versions`)
are used by the coordinator, nodes, relays and local workers alike.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import inspect
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

ENTRY_POINT_GROUP = "thrift_trainer.plugins"
SEPARATOR = ":"

_lock = threading.Lock()
_allowed: set[str] = set()  # module names named with --plugins or by an entry point
_named: list[str] = []  # what `allow` was given, in order, for child processes
_paths: list[str] = []  # folders `allow` put on the import path
_entry_points_read = False
_process = "this process"  # who refuses a plug-in, in messages: set by `allow_from_args`


class PluginError(ValueError):
    """A plug-in that cannot be used here; the message names it and says what to do."""


def is_plugin_name(name: str) -> bool:
    """Whether ``name`` names a plug-in (``module:attribute``) rather than a built-in."""
    module, sep, attribute = name.partition(SEPARATOR)
    return bool(sep and module and attribute)


def allow(modules: Iterable[str], search_path: str | Path | None = None) -> list[str]:
    """Allow these modules (``--plugins``) and import them now, so that a missing or
    broken one stops the process at start with one line (PluginError). ``search_path``
    (default: the current folder) is put on the import path first, as ``python -m`` would.
    Returns the modules imported."""
    names = [name.strip() for name in modules if name.strip()]
    folder = str(Path(search_path or Path.cwd()).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    with _lock:
        if folder not in _paths:
            _paths.append(folder)
    for name in names:
        _check_module_name(name)
        with _lock:
            _allowed.add(name)
            if name not in _named:
                _named.append(name)
        _import(name)
    return names


def startup() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(modules, folders) this process allowed, for a child process to allow the same
    (a node's local workers): `allow_again` takes them."""
    with _lock:
        return tuple(_named), tuple(_paths)


def allow_again(startup_state: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
    modules, folders = startup_state
    for folder in folders:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    allow(modules, folders[0] if folders else None)


def allowed_modules() -> list[str]:
    """Every module this process may import plug-ins from, entry points included."""
    _read_entry_points()
    with _lock:
        return sorted(_allowed)


def reset() -> None:
    """Forget every allowed module (tests)."""
    global _entry_points_read, _process
    _process = "this process"
    with _lock:
        _allowed.clear()
        _named.clear()
        _paths.clear()
        _entry_points_read = False


def resolve(name: str, kind: str) -> Any:
    """The object ``module:attribute`` names, from an allowed module; PluginError names the
    plug-in and says how to allow it. ``kind`` says what it is for ("model", "data set",
    ...): the object must be one the module defines itself, of that kind (`_KINDS`), and
    ``attribute`` one public name, so that a run reaches nothing through the module (what it
    imported: ``torch.os.system``, ``from os import system``, a builtin)."""
    if not is_plugin_name(name):
        raise PluginError(f"{kind} {name!r} is not a plug-in name (module:attribute)")
    module_name, _, attribute = name.partition(SEPARATOR)
    _check_module_name(module_name)
    if not _is_allowed(module_name):
        raise PluginError(lacking(module_name))
    module = _import(module_name)
    reason = _why_not(module, attribute, kind)
    if reason is not None:
        raise _refusal(name, kind, module, reason)
    return vars(module)[attribute]


def lacking(module_name: str) -> str:
    """Why a module is refused, in one line: what this process allows instead, the allowed
    module nearest the name (a typo), and a ``--plugins`` that keeps the modules it has
    (the flag replaces them: one naming the new module alone would drop the others)."""
    allowed = allowed_modules()
    top = module_name.split(".")[0]
    near = difflib.get_close_matches(top, allowed, n=1, cutoff=0.75)
    allows = (f"it allows {', '.join(allowed)}" if allowed else "it allows no plug-in module")
    if near:
        allows += f" (did you mean {near[0]}?)"
    with _lock:
        kept = [name for name in _named if name != top]
    return f"lacks plug-in {module_name}: {allows}; start it with --plugins " + ",".join(
        [*kept, top])


def _why_not(module: ModuleType, attribute: str, kind: str) -> str | None:
    """Why a run may not name ``attribute`` of ``module`` as a ``kind``; None if it may.
    Read from the module's own namespace, never through getattr (a module __getattr__)."""
    if "." in attribute:
        return "not a dotted path"
    if not attribute.isidentifier():
        return f"{attribute!r} is not a Python name"
    if attribute.startswith("_"):
        return "not a private or special name"
    if attribute not in vars(module):
        return f"{module.__name__} has no attribute {attribute!r}"
    value = vars(module)[attribute]
    if isinstance(value, ModuleType):
        return f"{attribute} is a module it imports"
    if (inspect.isclass(value) or callable(value)) and not _defined_in(value, module.__name__):
        home = getattr(_unwrapped(value), "__module__", None) or "another module"
        return f"{attribute} is defined in {home}, not by {module.__name__}"
    fits, what = _KINDS.get(kind, _DEFAULT_KIND)
    if not fits(value):
        shown = "class" if inspect.isclass(value) else type(value).__name__
        return f"{attribute} is {_article(shown)} {shown}, not {what}"
    return None


def _defined_in(value: Any, module_name: str) -> bool:
    """Whether the module (or, for a package, a module of its own) defined ``value``: its
    ``__module__``, and that of what it wraps (functools.wraps copies the name)."""
    for each in (value, _unwrapped(value)):
        home = getattr(each, "__module__", None)
        if not (isinstance(home, str) and
                (home == module_name or home.startswith(module_name + "."))):
            return False
    return True


def _is_function(value: Any) -> bool:
    """A Python function, or a wrapper of one (a decorator's, an lru_cache)."""
    return callable(value) and inspect.isfunction(_unwrapped(value))


def _unwrapped(value: Any) -> Any:
    try:
        return inspect.unwrap(value)
    except ValueError:  # a cycle of __wrapped__
        return value


def _is_class_or_function(value: Any) -> bool:
    return inspect.isclass(value) or _is_function(value)


def _is_model(value: Any) -> bool:
    """An nn.Module class (told by its bases' names: this process may not have torch) or a
    function."""
    if inspect.isclass(value):
        return any(f"{base.__module__}.{base.__qualname__}" == "torch.nn.modules.module.Module"
                   for base in inspect.getmro(value))
    return _is_function(value)


# What a run may name as each kind of plug-in: (test, what it must be, for messages).
_DEFAULT_KIND = (_is_class_or_function, "a class or a function")
_KINDS = {
    "model": (_is_model, "an nn.Module class or a function"),
    "data set": _DEFAULT_KIND,
    "algorithm": (inspect.isclass, "a class"),
    "codec": (inspect.isclass, "a class"),
    "aggregation rule": (_is_function, "a function"),
    "loss": (_is_function, "a function"),
    "metric": (_is_function, "a function"),
    "partitioner": (_is_function, "a function"),
    "transform": (_is_function, "a function"),
}
_SHOWN = 8  # names of what a module allows that a refusal lists


def _refusal(name: str, kind: str, module: ModuleType, reason: str) -> PluginError:
    """One line: which process refuses what, what the module allows, and why."""
    allowed = [attribute for attribute in vars(module)
               if _why_not(module, attribute, kind) is None]
    shown = ", ".join(allowed[:_SHOWN]) + (", ..." if len(allowed) > _SHOWN else "")
    return PluginError(f"{_process} refuses {kind} {name}: a run may name only "
                       f"{_article(kind)} {kind} {module.__name__} defines itself "
                       f"({shown or 'none'}); {reason}")


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def versions() -> dict[str, str]:
    """The allowed modules that are imported (and their imported submodules), each with its
    version: the distribution's version, else the module's ``__version__``, else a hash of
    its source file as it was when first asked (so two copies of a plain file compare equal
    only when they are the same, and a file edited after its import still reports the code
    the process runs)."""
    allowed = allowed_modules()
    found = {}
    for name, module in list(sys.modules.items()):
        if module is not None and any(name == a or name.startswith(a + ".") for a in allowed):
            found[name] = module_version(module)
    return found


_hashed: dict[str, tuple[object, str]] = {}  # module name -> (its import, its source hash)


def module_version(module: ModuleType) -> str:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    top = module.__name__.split(".")[0]
    for distribution in importlib.metadata.packages_distributions().get(top, []):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        source = inspect.getsourcefile(module)
    except TypeError:
        source = None
    if source is None:
        return "unknown"
    loaded = module.__spec__ or module  # a new import (a reload too) brings a new spec
    with _lock:
        earlier = _hashed.get(module.__name__)
        if earlier is None or earlier[0] is not loaded:
            digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:12]
            earlier = _hashed[module.__name__] = (loaded, f"sha256:{digest}")
    return earlier[1]


def _is_allowed(module_name: str) -> bool:
    """A module is allowed when it, or a package above it, was allowed."""
    allowed = allowed_modules()
    parts = module_name.split(".")
    return any(".".join(parts[:n]) in allowed for n in range(1, len(parts) + 1))


def _read_entry_points() -> None:
    """Modules advertised by installed packages, read once per process."""
    global _entry_points_read
    with _lock:
        if _entry_points_read:
            return
        _entry_points_read = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _allowed.add(entry.value.partition(SEPARATOR)[0])


def _check_module_name(name: str) -> None:
    if not all(part.isidentifier() for part in name.split(".")):
        raise PluginError(f"{name!r} is not a Python module name")


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise PluginError(f"plug-in module {module_name} is not found (looked in the "
                              f"current folder and the Python path)") from None
        raise PluginError(f"plug-in module {module_name} cannot be imported: {exc}") from None
    except Exception as exc:  # the plug-in's own code failed on import
        raise PluginError(f"plug-in module {module_name} failed on import: "
                          f"{type(exc).__name__}: {exc}") from None


def add_arguments(parser: Any) -> None:
    """The ``--plugins`` and ``--plugin-dir`` options of the coordinator and the nodes."""
    group = parser.add_argument_group(
        "plug-ins", "Code of your own (models, data sets, algorithms, aggregation rules, "
                    "codecs) that runs may name as module:attribute; see docs/plugins.md. "
                    f"Installed packages listed in the entry-point group {ENTRY_POINT_GROUP} "
                    "are allowed too.")
    group.add_argument("--plugins", default="", metavar="MODULES",
                       help="comma-separated modules this process may import for runs "
                            "(e.g. my_models,my_data), imported at start")
    group.add_argument("--plugin-dir", default=None, metavar="DIR",
                       help="folder the --plugins modules are found in (default: the "
                            "current folder, then the Python path)")


def allow_from_args(args: Any, process: str = "this process") -> str | None:
    """Allow the modules the command line names; the problem as one line, or None.
    ``process`` ("coordinator", "node", "relay", "pull node") names this process in the
    refusals of plug-ins a run may not name."""
    global _process
    _process = process
    if args.plugin_dir is not None and not Path(args.plugin_dir).is_dir():
        return f"--plugin-dir {args.plugin_dir} is not a folder"
    try:
        allow(args.plugins.split(","), args.plugin_dir)
        _read_entry_points()
    except PluginError as exc:
        return str(exc)
    return None
