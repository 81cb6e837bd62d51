"""`import attnres_ge` from inside the clone: an installed copy wins over the clone's entry folder, which alone
has no subpackages; without one, the clone's folders serve (as an editable install maps them).

The real wheel is built, installed and imported by `make test-wheel` (tests/smoke/installed_wheel.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_without_an_installed_copy_the_clone_folders_are_the_subpackages():
    package, op_host = run_in_clone_root(None)
    assert package == ROOT / "attnres_ge" / "__init__.py"
    assert op_host == ROOT / "op_host" / "__init__.py"
