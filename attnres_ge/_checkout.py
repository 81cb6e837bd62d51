"""Importing `attnres_ge` from inside a clone of the repository.

Installed, `attnres_ge` is one folder holding its subpackages. In a clone, the `attnres_ge/`
folder holds only the package entry; the subpackages are the folders beside it (`op_proto/`,
`op_host/`, `op_kernel/`, `ge_plugin/`, `examples/`: pyproject.toml maps them). Python puts the
current directory first on sys.path, so from the clone's root `import attnres_ge` finds this
folder rather than the installed package. Then:

- when an installed copy exists further down sys.path, it is loaded in this one's place: it
  is complete, with the native extensions built for it;
- otherwise (a clone used as is, or an editable install, which maps the same folders) the
  subpackages are taken from the folders beside this one.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import PathFinder
from pathlib import Path

CHECKOUT_MARKER = "ge_plugin"  # a subpackage: inside the package when installed, beside it in a clone


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except OSError:
        return None


def installed_in_place_of_checkout(name: str, path: list[str]) -> bool:
    """For the package `name` whose `__path__` is `path`: True when an installed copy replaced it in
    sys.modules (its import is then done), False when the import goes on from this folder (whose `path`
    has been completed with the clone's root where needed)."""
    here = Path(path[0]).resolve()
    if (here / CHECKOUT_MARKER).is_dir():  # installed: nothing to do
        return False
    root = here.parent
    others = [entry for entry in sys.path if _resolved(entry) != root]
    installed = PathFinder.find_spec(name, others)
    if installed is not None and installed.origin and Path(installed.origin).resolve().parent != here:
        module = importlib.util.module_from_spec(installed)
        sys.modules[name] = module
        installed.loader.exec_module(module)
        return True
    path.append(str(root))
    return False
