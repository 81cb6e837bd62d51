"""Which torch op converts with which converter, for the local GE and for torchair.

Local (always): `local_converters()` maps each torch op overload to its converter bound to this
package's `ge` module: every op of the registry (ge_plugin/ops.py), plus CANN's
`cann_ops_transformer` op of the same name when that library is loaded (looked up at each
call, so loading it later still counts).

torchair (when `import torchair` succeeds): `register_torchair_converters()` registers the same
converters, bound to `torchair.ge`, with `torchair.register_fx_node_ge_converter(op)`. It runs
once at import of this package and can be called again after torchair is imported later.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
import weakref
from collections.abc import Callable
from types import ModuleType

import torch

from attnres_ge.ge_plugin import ge as local_ge
from attnres_ge.ge_plugin import ops
from attnres_ge.ge_plugin.ops import CANN_NAMESPACE, NAMESPACE


def _overload(namespace: str, op_name: str):
    """torch.ops.<namespace>.<op_name>.default, or None when that library is not loaded."""
    try:
        return getattr(getattr(torch.ops, namespace), op_name).default
    except (AttributeError, RuntimeError):
        return None


def _converter_makers() -> list[tuple[object, Callable[[ModuleType], Callable]]]:
    """(torch op overload, converter factory taking a `ge` namespace) for every op loaded now."""
    pairs = [(_overload(NAMESPACE, op.name), op.converter.make_converter) for op in ops.OPS]
    pairs += [(_overload(CANN_NAMESPACE, op.name), op.converter.make_cann_converter) for op in ops.OPS
              if hasattr(op.converter, "make_cann_converter")]
    return [(op, make) for op, make in pairs if op is not None]


def local_converters() -> dict[object, Callable]:
    """torch op overload -> converter emitting into the local `ge` graph builder."""
    return {op: make(local_ge) for op, make in _converter_makers()}


_registered_with: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # torchair module -> ops registered there


def register_torchair_converters(torchair: ModuleType | None = None) -> list:
    """Register every converter with `torchair.register_fx_node_ge_converter`; returns the ops newly registered.

    `torchair` defaults to the importable torchair package; without one nothing happens.
    """
    torchair = torchair if torchair is not None else _import_torchair()
    if torchair is None:
        return []
    done = _registered_with.setdefault(torchair, set())
    newly = []
    for op, make in _converter_makers():
        if op in done:
            continue
        torchair.register_fx_node_ge_converter(op)(make(torchair.ge))
        done.add(op)
        newly.append(op)
    return newly


def _import_torchair() -> ModuleType | None:
    """torchair if it is importable, else None (the CPU default). Never imports torch_npu itself.

    After `import torch_npu`, sys.modules["torchair"] is a lazy placeholder whose attributes raise
    until the real package is imported; import_module performs that import.
    """
    if "torchair" not in sys.modules and importlib.util.find_spec("torchair") is None:
        return None
    try:
        return importlib.import_module("torchair")
    except Exception as error:  # a broken optional install must not break the eager ops
        warnings.warn(f"attnres_ge: torchair is installed but failed to import ({error!r}); "
                      "its converters are not registered", RuntimeWarning, stacklevel=2)
        return None
