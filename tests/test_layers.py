"""The package's layers (docs/architecture.md, "The layers"): each folder imports only the folders below it.

    op_proto -> op_host -> op_kernel -> ge_plugin -> attnres_ge and examples (the package entry: the public
    API, the CLI and its benchmark; the examples, which use the API and which the CLI runs)

Read from the source with ast, so a new upward import fails here before anyone trips on a cycle.
The local GE must not depend on the eager torch-op modules either (the modules it imports, not
its package's __init__, which defines the torch ops on import).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LEVELS = {"op_proto": 0, "op_host": 1, "op_kernel": 2, "ge_plugin": 3, "attnres_ge": 4, "examples": 4}
# One deliberate function-level import: the local `ge` builder finds prototypes through the op registry,
# which imports the converters, which import the builder.
ALLOWED_UPWARD = {("ge_plugin/ge.py", "attnres_ge.ge_plugin.ops")}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {module for module in modules if module.startswith("attnres_ge")}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LEVELS else "attnres_ge"


def sources():
    for layer in LEVELS:
        for path in sorted((REPO / layer).glob("*.py")):
            yield layer, path


@pytest.mark.parametrize(("layer", "path"), list(sources()), ids=lambda value: getattr(value, "name", value))
def test_imports_point_down(layer, path):
    relative = path.relative_to(REPO).as_posix()
    upward = sorted(
        module for module in imported_modules(path)
        if LEVELS[layer_of(module)] > LEVELS[layer] and (relative, module) not in ALLOWED_UPWARD
    )
    assert not upward, f"{relative} ({layer}) imports from layers above it: {upward}"


def test_local_ge_does_not_depend_on_the_eager_ops():
    eager_modules = {"attnres_ge.ge_plugin.op_common", "attnres_ge.ge_plugin.block_attention_residuals",
                     "attnres_ge.ge_plugin.block_attention_residuals_grad"}
    seen, pending = set(), ["attnres_ge.ge_plugin.local_ge"]
    while pending:  # everything the local GE reaches through module-level imports of this package
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        path = REPO / module.split(".")[1] / (module.split(".")[2] + ".py") if module.count(".") == 2 else None
        if path is not None and path.exists():
            pending.extend(imported_modules_at_top(path))
    assert not seen & eager_modules, f"the local GE reaches {sorted(seen & eager_modules)}"


def imported_modules_at_top(path: Path) -> set[str]:
    """Modules imported by statements at module level (not inside functions): what importing it runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set()
    for node in tree.body:
        for inner in ast.walk(node) if isinstance(node, ast.Try) else [node]:
            if isinstance(inner, ast.ImportFrom) and inner.module and inner.module.startswith("attnres_ge"):
                modules.add(inner.module)
                modules.update(f"{inner.module}.{alias.name}" for alias in inner.names)
            elif isinstance(inner, ast.Import):
                modules.update(alias.name for alias in inner.names if alias.name.startswith("attnres_ge"))
    return modules
