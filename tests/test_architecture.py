"""The layout's rules, read from the source: imports flow one way, the solve stages are plain data.

Layers, lowest first: solvers and plain rules; shared facts about traces; executor adapters; the
two passes (neither imports the other); the plugin boundary; the inspection tools and entry points.
A module imports only from its own layer or below. (A package's ``__init__`` is not a dependency
of its submodules here: ``thunder_remat/__init__`` registers the plugin, which needs Thunder.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
LAYERS = (
    ("solvers", "policies", "budget", "records", "config"),
    ("cost", "storage", "trace_facts", "fusion_regions", "verify"),
    ("executors",),
    ("whole_graph", "pairs"),
    ("plugin",),
    ("inspect", "models", "zoo", "__main__", "__init__"),
)
#: modules that must not import thunder, directly or through the thunder_remat modules they import
PLAIN = ("solvers", "policies", "budget", "records", "whole_graph.problem", "whole_graph.planner", "pairs.problem",
         "pairs.solve")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "thunder_remat").rglob("*.py")):
        parts = path.relative_to(ROOT / "thunder_remat").with_suffix("").parts
        found[".".join(parts)] = path
    for path in sorted((ROOT / "executors").glob("*.py")):
        found["executors." + path.stem] = path
    return {name.removesuffix(".__init__") if name != "__init__" else name: p for name, p in found.items()}


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (function bodies included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _ours(name: str) -> str | None:
    """``thunder_remat.x.y`` -> the module key ``x.y`` (or its package ``x`` if that is the module)."""
    if not name.startswith("thunder_remat"):
        return None
    rest = name.removeprefix("thunder_remat").lstrip(".")
    while rest and rest not in MODULES:
        rest = rest.rpartition(".")[0]
    return rest or None


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return next(k for k, layer in enumerate(LAYERS) if top in layer)


def _dependencies(module: str) -> set[str]:
    deps = {_ours(n) for n in _imports(MODULES[module])} - {None, module}
    return {d for d in deps if d != "__init__" and not module.startswith(d + ".") and d != module.split(".")[0]}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_upwards(module):
    for dep in _dependencies(module):
        assert _layer(dep) <= _layer(module), f"{module} (layer {_layer(module)}) imports {dep} (layer {_layer(dep)})"
    top = module.split(".")[0]
    if top in ("whole_graph", "pairs"):
        other = "pairs" if top == "whole_graph" else "whole_graph"
        assert not any(d.split(".")[0] == other for d in _dependencies(module)), f"{module} imports the other pass"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(PLAIN)))
def test_the_solve_stages_import_no_thunder(module):
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        thunder = {n for n in _imports(MODULES[current]) if n == "thunder" or n.startswith("thunder.")}
        assert not thunder, f"{module} reaches thunder through {current}: {sorted(thunder)}"
        todo.extend(_dependencies(current))


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def _options_table() -> dict[str, tuple[str, str]]:
    """docs/options.md's table: keyword -> (compile option, "type, default" cell)."""
    rows = {}
    for line in (ROOT / "docs" / "options.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`remat"):
            option, keyword, default = cells[0].strip("`"), cells[1].strip("`"), cells[2]
            assert keyword not in rows, f"docs/options.md lists {keyword} twice"
            rows[keyword] = (option, default)
    return rows


def test_the_options_table_matches_the_config():
    """Every RematConfig field has one row, under its compile option and keyword, with its default."""
    from dataclasses import fields

    from thunder_remat.config import COMPILE_OPTIONS, RematConfig

    table = _options_table()
    assert set(table) == {f.name for f in fields(RematConfig)}
    assert {option: keyword for keyword, (option, _) in table.items()} == {o: f for o, (f, _) in COMPILE_OPTIONS.items()}
    defaults = RematConfig()
    for keyword, (_, cell) in table.items():
        value = getattr(defaults, keyword)
        if keyword == "policies":
            assert "`thunder_remat.DEFAULT_POLICIES`" in cell
        elif keyword == "enabled":  # True with a transform or plugin, False with compile options alone
            assert "False with no transform/plugin, True with one" in cell
        else:
            shown = cell.rpartition(",")[2].strip().strip("`")
            assert shown == (f'"{value}"' if isinstance(value, str) else repr(value)), (keyword, cell)
