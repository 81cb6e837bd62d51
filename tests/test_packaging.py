"""`import attnres_ge` from inside the clone: an installed copy wins over the clone's entry folder, which alone
has no subpackages; without one, the clone's folders serve (as an editable install maps them).

The real wheel is built, installed and imported by `make test-wheel` (tests/smoke/installed_wheel.py)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHICH = "import attnres_ge, attnres_ge.op_host as h; print(attnres_ge.__file__); print(h.__file__)"


def run_in_clone_root(extra_path: Path | None) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(extra_path) if extra_path else ""}
    result = subprocess.run([sys.executable, "-c", WHICH], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return [Path(line).resolve() for line in result.stdout.split()]


def test_an_installed_copy_is_imported_in_place_of_the_clone(tmp_path):
    installed = tmp_path / "site" / "attnres_ge"
    for sub in ("", "ge_plugin", "op_host"):
        (installed / sub).mkdir(parents=True, exist_ok=True)
        (installed / sub / "__init__.py").write_text("")
    package, op_host = run_in_clone_root(tmp_path / "site")
    assert package == installed / "__init__.py"
    assert op_host == installed / "op_host" / "__init__.py"


def _installed_copy() -> str | None:
    """Where an installed (not editable) attnres_ge lies on this interpreter's path, if anywhere."""
    from importlib.machinery import PathFinder

    others = [entry for entry in sys.path if Path(entry or ".").resolve() != ROOT]
    spec = PathFinder.find_spec("attnres_ge", others)
    return spec.origin if spec is not None and spec.origin else None


def test_without_an_installed_copy_the_clone_folders_are_the_subpackages():
    if _installed_copy():  # the main suite's run on the newer torch uses the wheel (Makefile test-next)
        pytest.skip(f"this interpreter has an installed copy ({_installed_copy()}): the premise does not hold")
    package, op_host = run_in_clone_root(None)
    assert package == ROOT / "attnres_ge" / "__init__.py"
    assert op_host == ROOT / "op_host" / "__init__.py"


def test_the_wheel_lists_every_package_folder_and_no_development_tool():
    """pyproject.toml names the wheel's packages one by one: each folder of the package that holds an
    __init__.py is among them (a new subpackage is not left out), and tools/ is not."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {"attnres_ge." + ".".join(path.parent.relative_to(ROOT / "attnres_ge").parts)
               for path in (ROOT / "attnres_ge").rglob("__init__.py") if path.parent != ROOT / "attnres_ge"}
    assert folders <= listed, sorted(folders - listed)
    assert {"attnres_ge.bench", "attnres_ge.bench.cases"} <= listed
    assert not any("tools" in name.split(".") for name in listed)
    assert "tools" not in config["package-dir"].values() and (ROOT / "tools" / "loop_model.py").exists()


# ---- torch's private internals: the package may use one only where the suite runs on every supported torch
# (CI: the main suite on torch 2.13.0 and 2.14.1). This lists each use and checks that it resolves on the
# torch running the suite, so a release that drops or moves one fails here by name, not through a fallback.
PACKAGE_FOLDERS = ("attnres_ge", "op_proto", "op_host", "op_kernel", "ge_plugin", "examples")


def _dotted(node) -> str | None:
    """'torch._C._foo' for an attribute chain rooted at the name `torch`, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch":
        return ".".join(["torch", *reversed(parts)])
    return None


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split(".")[1:])


def private_torch_uses() -> dict[str, list[str]]:
    """Every private torch name the package's Python code touches -> where (file:line)."""
    found: dict[str, list[str]] = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.endswith("_pb2.py"):
                continue
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names if alias.name.split(".")[0] == "torch"]
                elif isinstance(node, ast.Attribute):
                    names = [name for name in [_dotted(node)] if name]
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                      and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                      and (base := _dotted(node.args[0]))):
                    names = [f"{base}.{node.args[1].value}"]
                for name in names:
                    if _private(name):
                        found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    # Keep only the longest chains (torch._C._foo covers torch._C).
    return {name: where for name, where in found.items()
            if not any(other != name and other.startswith(name + ".") for other in found)}


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            target = getattr(target, part)
        return target
    raise ImportError(dotted)


def test_every_private_torch_name_the_package_uses_exists_on_this_torch():
    import torch

    uses = private_torch_uses()
    # The scan sees each kind of use (attribute chain, from-import, getattr with a default).
    assert {"torch._C._AutoDispatchBelowAutograd", "torch._functorch.aot_autograd.make_boxed_func",
            "torch._C._storage_Use_Count"} <= set(uses), sorted(uses)
    missing = []
    for name, where in sorted(uses.items()):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as error:
            missing.append(f"{name} ({', '.join(where)}): {error!r}")
    assert not missing, f"torch {torch.__version__} lacks private names the package uses:\n" + "\n".join(missing)
