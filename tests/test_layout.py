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


def _imports(name: str, tree: ast.Module) -> set[str]:
    """hetgrad modules that ``name`` imports at module level (not under TYPE_CHECKING)."""
    is_pkg = (PKG / name.replace(".", "/") / "__init__.py").exists()
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = here[:len(here) - (node.level - 1)]
        if node.module:
            target = ".".join([*base, *node.module.split(".")])
            out.add(target if target in MODULES else target.rsplit(".", 1)[0])
        for alias in node.names:
            full = ".".join([*base, *([node.module] if node.module else []), alias.name])
            if full in MODULES:
                out.add(full)
    return out - {name}


def test_no_import_cycle():
    graph = {name: _imports(name, tree) for name, tree in MODULES.items()}
    assert graph["trainer"] >= {"loop", "actions", "record", "keras"}  # the parser sees imports
    assert graph["keras"] >= {"keras.callbacks", "keras.optimizer", "compat", "aggregate"}
    assert graph["keras.optimizer"] >= {"compat", "aggregate"}
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            assert state.get(nxt) != "open", " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for name in graph:
        if name not in state:
            visit(name, [])


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
