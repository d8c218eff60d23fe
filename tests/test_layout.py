"""The package stays readable: small modules, short functions, no import cycle, and the
``hetgrad train`` options generated from TrainConfig cannot drift from it."""
import ast
from pathlib import Path

import pytest

from hetgrad import cli
from hetgrad.config import SETTINGS, TrainConfig
from hetgrad.errors import ConfigError

PKG = Path(__file__).resolve().parents[1] / "hetgrad"
FILES = sorted(PKG.rglob("*.py"))


def module_name(path: Path) -> str:
    """``hetgrad/keras/optimizer.py`` -> ``keras.optimizer``; a package is its ``__init__``."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "hetgrad"


MODULES = {module_name(p): ast.parse(p.read_text()) for p in FILES}


def test_modules_and_functions_are_small():
    long_modules = {str(p): n for p in FILES if (n := len(p.read_text().splitlines())) > 250}
    assert not long_modules
    long_functions = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1}"
                      for name, tree in MODULES.items() for node in ast.walk(tree)
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.end_lineno - node.lineno + 1 > 60]
    assert not long_functions


def _under_type_checking(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _targets(name: str, node) -> set[str]:
    """The hetgrad modules (``MODULES`` names) that one import node of module ``name``
    imports; other packages as their top-level name prefixed with ``ext:``."""
    is_pkg = (PKG / name.replace(".", "/") / "__init__.py").exists()
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    if name == "hetgrad":
        here = []
    if isinstance(node, ast.Import):
        full = [a.name for a in node.names]
    elif node.level == 0:
        full = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
        base = ".".join(here[:len(here) - (node.level - 1)])
        mod = ".".join(p for p in (base, node.module or "") if p)
        full = [f"hetgrad.{mod}" if mod else "hetgrad"] + \
            [f"hetgrad.{mod}.{a.name}" if mod else f"hetgrad.{a.name}" for a in node.names]
    out = set()
    for f in full:
        if f == "hetgrad" or f.startswith("hetgrad."):
            rel = f[len("hetgrad."):] if f != "hetgrad" else "hetgrad"
            while rel not in MODULES and "." in rel:
                rel = rel.rsplit(".", 1)[0]
            if rel in MODULES:
                out.add(rel)
        else:
            out.add("ext:" + f.split(".")[0])
    return out


def imports(name: str, tree: ast.Module, *, module_level: bool) -> set[str]:
    """What module ``name`` imports: every import it can run (in functions too), or only
    those run when it is imported; never those under ``TYPE_CHECKING``."""
    skipped = _under_type_checking(tree)
    nodes = tree.body if module_level else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            found |= _targets(name, node)
    return found - {name}


RUNTIME = {name: {t for t in imports(name, tree, module_level=False) if not t.startswith("ext:")}
           for name, tree in MODULES.items()}
AT_IMPORT = {name: imports(name, tree, module_level=True) for name, tree in MODULES.items()}


def test_no_import_cycle_not_even_through_deferred_imports():
    graph = RUNTIME
    assert graph["trainer"] >= {"loop", "actions", "record"}   # the parser sees imports
    assert graph["keras"] >= {"keras.callbacks", "_keras.optimizer", "aggregate"}
    assert graph["_keras.optimizer"] >= {"compat", "aggregate"}
    assert "compat" in graph["checkpoint"]                     # a deferred one
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != "open", " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_only_the_public_keras_package_imports_itself():
    """hetgrad's own modules use the implementation (``hetgrad._keras``), never the public
    ``hetgrad.keras`` (Horovod keeps its implementation in ``horovod/_keras`` the same way)."""
    public = {n for n in MODULES if n == "keras" or n.startswith("keras.")}
    users = {n for n, deps in RUNTIME.items() if deps & public and n not in public}
    assert not users


# what the start-up checks run: importing them must not load TensorFlow, so a bad flag or
# file is refused in about a second (tests/test_bad_inputs.py checks the same by running them)
CHECKS = ("cli", "config", "validate", "planning", "partition", "perfmodel", "checkpoint",
          "runtime", "launcher", "comm", "io", "errors", "emulate", "probe", "data")
HEAVY = {"ext:tensorflow", "ext:horovod", "ext:keras", "ext:tf_keras"}


def test_the_start_up_checks_import_no_tensorflow():
    def closure(name, seen):
        for dep in AT_IMPORT.get(name, ()):
            if dep not in seen:
                seen.add(dep)
                if not dep.startswith("ext:"):
                    closure(dep, seen)
        return seen

    loads = {name: sorted(closure(name, set()) & HEAVY) for name in CHECKS}
    assert not {name: heavy for name, heavy in loads.items() if heavy}


def test_train_options_are_the_config_fields():
    params = {p.name: p for p in cli.train.params}
    assert set(params) == set(SETTINGS)
    defaults = TrainConfig()
    for name, f in SETTINGS.items():
        p = params[name]
        assert p.default == getattr(defaults, name), name
        assert f.metadata["help"] in p.help, name
        for choice in f.metadata["choices"] or ():
            assert choice in p.help, (name, choice)
    assert "-B" in params["global_batch"].opts and params["quiet"].is_flag


def test_library_errors_name_the_field_and_the_cli_shows_its_flag():
    with pytest.raises(ConfigError) as info:
        TrainConfig(global_batch=0).check()
    err = info.value
    assert err.field == "global_batch" and str(err) == "global_batch: must be >= 1, got 0"
    assert err.render() == "--global-batch: must be >= 1, got 0"
    assert err.render({"global_batch": "-B"}) == "-B: must be >= 1, got 0"
    assert cli.flag_of("probe_file", cli.PLAN_OVERRIDES) == "--probe"
    assert cli.flag_of("probe_file") == "--probe-file"
