"""Interop tier: the real torchair (from the torch_npu wheel) on a CPU, with a stand-in for its native module.

Runs in its own venvs, never in a main one: torch 2.13.0 with torch_npu 2.13.0, and torch 2.14.1 with
torch_npu 2.14.0 (installed with --no-deps: it requires torch 2.14.0.*); each with protobuf, packaging,
pytest and the project (the Makefile's test-interop and test-interop-next):

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 <venv>/bin/python -m pytest tests/interop --confcutdir=tests/interop -q

Import order matters and is fixed here, before any test module loads:
1. TORCH_DEVICE_BACKEND_AUTOLOAD=0 before torch is imported (else `import torch` autoloads
   torch_npu, which fails without CANN);
2. <site-packages>/torch_npu/dynamo on sys.path, so `torchair` is a top-level package;
3. the stand-in at sys.modules["torchair.core._torchair"];
4. import torchair, then attnres_ge (whose converters register with torchair when it imports).

Without torch_npu the tier is skipped with the reason, except under CI (env CI set), where it fails.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # must precede the first `import torch`

import importlib.util  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

HERE = Path(__file__).resolve().parent
TORCH_NPU_TESTED = "2.13.0 or 2.14.0"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _torchair_dir() -> tuple[Path | None, str]:
    """(<site-packages>/torch_npu/dynamo, "") or (None, why it is unusable)."""
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") != "0":
        return None, "TORCH_DEVICE_BACKEND_AUTOLOAD is not 0 (set it before Python starts)"
    spec = importlib.util.find_spec("torch_npu")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None, f"torch_npu is not installed (pip install torch_npu {TORCH_NPU_TESTED} into the interop venv)"
    dynamo = Path(spec.submodule_search_locations[0]) / "dynamo"
    if not (dynamo / "torchair" / "__init__.py").is_file():
        return None, f"torch_npu at {dynamo.parent} has no dynamo/torchair"
    return dynamo, ""


def _missing_modules() -> str:
    """torchair needs protobuf and packaging, which the torch_npu wheel does not declare."""
    missing = []
    for module, package in (("google.protobuf", "protobuf"), ("packaging", "packaging")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package `google` is absent
            found = False
        if not found:
            missing.append(package)
    return f"torchair needs {missing} (pip install {' '.join(missing)})" if missing else ""


def _import_torchair(dynamo: Path):
    sys.path.insert(0, str(HERE))
    import torchair_standin  # imports attnres_ge while torchair is not importable yet

    torchair_standin.install()
    sys.path.insert(0, str(dynamo))
    import torchair

    # Without torch_npu's own ops, the first graph with an unconverted op would print ~100
    # "Failed to import ... custom.X" warnings; import them once, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchair._ge_concrete_graph.ge_converter.custom  # noqa: F401
    from attnres_ge.ge_plugin.converters import register_torchair_converters

    register_torchair_converters(torchair)  # idempotent; attnres_ge may have been imported before torchair

    return torchair


# Known and harmless: torchair's imports use torch.jit; its AOT compiler takes unboxed arguments.
warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated", DeprecationWarning)
warnings.filterwarnings("ignore", "Your compiler for AOTAutograd is returning a function", UserWarning)

_DYNAMO, UNAVAILABLE = _torchair_dir()
UNAVAILABLE = UNAVAILABLE or _missing_modules()
if UNAVAILABLE and _in_ci():
    raise pytest.UsageError(f"interop tier: {UNAVAILABLE}. CI is set, and this tier must run in CI.")
if UNAVAILABLE:
    collect_ignore_glob = ["test_torchair_*.py"]  # test_interop_tier.py reports the skip and its reason
else:
    TORCHAIR = _import_torchair(_DYNAMO)


@pytest.fixture(scope="session")
def interop_unavailable() -> str:
    """Why the tier cannot run here ("" when it can)."""
    return UNAVAILABLE

