"""The package's layers (docs/architecture.md): each folder imports only the folders below it, and no
module imports itself back through others.

    op_proto -> op_host -> op_kernel -> ge_plugin -> attnres_ge and examples (the package entry: the public
    API, the CLI and its benchmark; the examples, which use the API and which the CLI runs)

Read from the source with ast, every import statement counted, those inside functions too: a deferred
import hides a dependency from the reader as well as from a cycle check. The local GE must not depend on
the eager torch-op modules either (the modules it imports, not its package's __init__, which defines the
torch ops on import).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LEVELS = {"op_proto": 0, "op_host": 1, "op_kernel": 2, "ge_plugin": 3, "attnres_ge": 4, "examples": 4}
PACKAGE = "attnres_ge"
EXTENSIONS = {"attnres_ge.op_kernel._native", "attnres_ge.ge_plugin._cpp_entry"}  # setup.py builds them


def imported_modules(path: Path) -> set[str]:
    """Every attnres_ge module an import statement anywhere in `path` loads: `from package import name`
    counts package.name where that is a module of ours, else the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                modules.add(submodule if submodule in MODULES or submodule in EXTENSIONS else node.module)
    return {module for module in modules if module.startswith(PACKAGE)}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LEVELS else "attnres_ge"


def sources():
    for layer in LEVELS:
        for path in sorted((REPO / layer).rglob("*.py")):
            yield layer, path


def module_name(layer: str, path: Path) -> str:
    """The dotted name `path` is imported as (attnres_ge.<layer>.<...>; attnres_ge/ is the entry itself)."""
    parts = list(path.relative_to(REPO / layer).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    prefix = [PACKAGE] if layer == "attnres_ge" else [PACKAGE, layer]
    return ".".join(prefix + parts)


MODULES = {module_name(layer, path): path for layer, path in sources()}


@pytest.mark.parametrize(("layer", "path"), list(sources()), ids=lambda value: getattr(value, "name", value))
def test_imports_point_down(layer, path):
    relative = path.relative_to(REPO).as_posix()
    upward = sorted(module for module in imported_modules(path) if LEVELS[layer_of(module)] > LEVELS[layer])
    assert not upward, f"{relative} ({layer}) imports from layers above it: {upward}"


def module_imports(module: str) -> set[str]:
    """The package modules `module` imports."""
    return {name for name in imported_modules(MODULES[module]) if name in MODULES and name != module}


def test_no_import_cycle():
    """Depth-first over every import (function-level ones included); a back edge is a cycle."""
    state: dict[str, str] = {}  # module -> "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(module_imports(module)):
            if state.get(imported) == "open":
                cycle = path[path.index(imported):] + [imported]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])


def test_the_cycle_check_sees_a_cycle(monkeypatch):
    """The check above fails on a cycle (here a made-up one between two real modules)."""
    real = module_imports

    def with_cycle(module: str) -> set[str]:
        extra = {"attnres_ge.ge_plugin.ops": {"attnres_ge.ge_plugin.converters"}}.get(module, set())
        return real(module) | extra

    monkeypatch.setitem(globals(), "module_imports", with_cycle)
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_no_import_cycle()


def test_local_ge_does_not_depend_on_the_eager_ops():
    eager_modules = {"attnres_ge.ge_plugin.op_common", "attnres_ge.ge_plugin.block_attention_residuals",
                     "attnres_ge.ge_plugin.block_attention_residuals_grad"}
    seen, pending = set(), ["attnres_ge.ge_plugin.local_ge"]
    while pending:  # everything the local GE reaches through any import of this package's modules
        module = pending.pop()
        if module in seen or module not in MODULES:
            continue
        seen.add(module)
        pending.extend(module_imports(module))
    assert not seen & eager_modules, f"the local GE reaches {sorted(seen & eager_modules)}"
