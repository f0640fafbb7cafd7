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
    ("solvers", "policies", "budget", "records", "config", "allocator"),
    ("cost", "kernel_workspace", "storage", "trace_facts", "fusion_regions", "verify"),
    ("executors",),
    ("whole_graph", "pairs"),
    ("plugin",),
    ("inspect", "models", "__main__", "__init__"),
)
#: modules that must not import thunder, directly or through the thunder_remat modules they import
PLAIN = ("solvers", "policies", "budget", "records", "whole_graph.problem", "whole_graph.planner", "whole_graph.reasons", "pairs.problem",
         "pairs.solve")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "thunder_remat").rglob("*.py")):
        parts = path.relative_to(ROOT / "thunder_remat").with_suffix("").parts
        found[".".join(parts)] = path
    for path in sorted((ROOT / "executors").rglob("*.py")):
        found[".".join(("executors", *path.relative_to(ROOT / "executors").with_suffix("").parts))] = path
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


#: the Thunder hooks, apart from the executor adapters (executors/hooks/)
HOOKS = ("builtin_pass", "compile_stash", "fsdp", "op_timing", "pipeline", "thunder_speedups", "thunderfx")


def test_the_hooks_are_apart_from_the_adapters():
    """executors/ holds the adapters, executors/hooks/ every other touch of Thunder; both install
    under ``thunder_remat.executors`` (pyproject.toml), as docs/architecture.md says first."""
    hooks = {m.removeprefix("executors.hooks.") for m in MODULES if m.startswith("executors.hooks.")}
    assert hooks == set(HOOKS)
    adapters = {m for m in MODULES if m.startswith("executors.") and m.count(".") == 1} - {"executors.hooks"}
    assert not {m.removeprefix("executors.") for m in adapters} & set(HOOKS)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"thunder_remat.executors" = "executors"' in pyproject and '"thunder_remat.executors.hooks"' in pyproject
    assert "thunder_remat.executors.hooks" in (ROOT / "docs" / "architecture.md").read_text().split("\n## ")[0]


def _compile_data_touches(path: Path) -> list[str]:
    """What ``path`` does with Thunder's compile data or stats besides reading a compile option:
    names it imports from ``thunder.core.compile_data``, calls of ``thunder.compile_data``/
    ``thunder.compile_stats``, and ``setattr`` calls."""
    touches = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "thunder.core.compile_data":
            touches += [a.name for a in node.names if a.name != "get_compile_option"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("compile_data", "compile_stats"):
            touches.append(node.func.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            touches.append(ast.unparse(node))
    return touches


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "executors.hooks.compile_stash"))
def test_only_the_stash_touches_thunders_compile_data(module):
    allowed = {"records": ["setattr(self.timings, self.attribute, getattr(self.timings, self.attribute) + elapsed)"]}
    assert _compile_data_touches(MODULES[module]) == allowed.get(module, [])


def test_the_stash_is_seen_touching_compile_data():
    """The check above can fail: it sees the stash's own touches."""
    touches = _compile_data_touches(MODULES["executors.hooks.compile_stash"])
    assert "_compile_data" in touches and "compile_stats" in touches and any("setattr(cd" in t for t in touches)


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
