"""The package stays readable: small modules, short functions, no import cycle, and the
``hetgrad train`` options generated from TrainConfig cannot drift from it."""
import ast
from pathlib import Path

import pytest

from hetgrad import cli
from hetgrad.config import SETTINGS, TrainConfig
from hetgrad.errors import ConfigError

PKG = Path(__file__).resolve().parents[1] / "hetgrad"
MODULES = {p.stem: ast.parse(p.read_text()) for p in PKG.glob("*.py")}


def test_modules_and_functions_are_small():
    long_modules = {p.name: n for p in PKG.glob("*.py")
                    if (n := len(p.read_text().splitlines())) > 250}
    assert not long_modules
    long_functions = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1}"
                      for name, tree in MODULES.items() for node in ast.walk(tree)
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.end_lineno - node.lineno + 1 > 60]
    assert not long_functions


def _imports(tree: ast.Module) -> set[str]:
    """hetgrad modules imported at module level (outside ``if TYPE_CHECKING``)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module == "hetgrad"):
            if node.module and node.level == 1:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names if a.name in MODULES)
    return out


def test_no_import_cycle():
    graph = {name: _imports(tree) for name, tree in MODULES.items()}
    assert graph["trainer"] >= {"loop", "actions", "record", "keras"}  # the parser sees imports
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
