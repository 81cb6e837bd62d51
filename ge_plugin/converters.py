"""The GE converters of the torch ops, derived from each op's prototype, and where they are registered.

`make_converter(op, ge)` is the converter of one registry op, written once against a `ge` namespace
(`custom_op`, `attr.Int/Float/Bool/Str`): this package's local `ge` module, or `torchair.ge` on an
Ascend machine. It takes the torch op's arguments (the prototype's inputs, then its attributes) and
`meta_outputs`, emits one node of the op's GE type with every prototype input, output and attribute,
and returns the graph tensors the torch op returns (all outputs but the reference ones).

Local (always): `local_converters()` maps each torch op overload to its converter bound to this
package's `ge` module: every op of the registry (ge_plugin/ops.py) and the tensor ops (the read and
the update with a fused norm, ops.TENSOR_OPS), plus CANN's `cann_ops_transformer` op of the same name
when that library is loaded (looked up at each call, so loading it later still counts).

torchair (when `import torchair` succeeds): `register_torchair_converters()` registers the same
converters, bound to `torchair.ge`, with `torchair.register_fx_node_ge_converter(op)`, but for the
tensor ops: CANN's GE has no BlockAttnResRead nor BlockAttnResUpdateNorm, so their torchair converters
(ge_plugin/read_torchair.py) emit CANN's ops (for the read: in CANN's case; the others are refused). It runs
once at import of this package and can be called again after torchair is imported later.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

from attnres_ge.ge_plugin import ge as local_ge
from attnres_ge.ge_plugin import ops
from attnres_ge.ge_plugin.ops import CANN_NAMESPACE, NAMESPACE, TorchOp
from attnres_ge.ge_plugin.read_torchair import (
    make_read_converter,
    make_read_grad_converter,
    make_update_norm_converter,
)
from attnres_ge.op_proto.op_def import ATTR_KINDS


def _overload(namespace: str, op_name: str):
    """torch.ops.<namespace>.<op_name>.default, or None when that library is not loaded."""
    try:
        return getattr(getattr(torch.ops, namespace), op_name).default
    except (AttributeError, RuntimeError):
        return None


def make_converter(op: TorchOp, ge: ModuleType, attr_names: Sequence[str] | None = None) -> Callable:
    """The converter of `op`'s torch op, emitting through `ge`. `attr_names`: how the torch op spells the
    prototype's attributes (CANN's torch ops: `op.cann_attr_names`); None: as the prototype does."""
    proto = op.prototype
    attr_names = tuple(attr.name for attr in proto.attrs) if attr_names is None else tuple(attr_names)
    signature = _converter_signature(op, attr_names)
    output_names = proto.output_names()
    returned = [output_names.index(name) for name in op.returned_outputs()]

    def convert(*arguments, **keywords):
        bound = signature.bind(*arguments, **keywords)
        bound.apply_defaults()
        values = bound.arguments
        attrs = {attr.name: getattr(ge.attr, attr.kind)(ATTR_KINDS[attr.kind](values[spelled]))
                 for attr, spelled in zip(proto.attrs, attr_names, strict=True)}
        outputs = ge.custom_op(proto.op_type, inputs={arg.name: values[arg.name] for arg in proto.inputs},
                               outputs=_output_spec(proto, values), attrs=attrs)
        outputs = (outputs,) if len(output_names) == 1 else tuple(outputs)
        picked = tuple(outputs[index] for index in returned)
        return picked[0] if len(picked) == 1 else picked

    convert.__signature__ = signature
    convert.__name__ = convert.__qualname__ = f"convert_{op.name}"
    convert.__doc__ = f"Graph tensors -> GE node {proto.op_type}: {proto.summary}"
    return convert


def _output_spec(proto, values) -> list:
    """The outputs as custom_op takes them. A dynamic output has one tensor per tensor of the prototype's one
    dynamic input (BlockAttnResReadGrad: a gradient per source), so it is named with that count, (name, n)."""
    dynamic_inputs = [arg.name for arg in proto.inputs if arg.presence == "dynamic"]
    spec = []
    for arg in proto.outputs:
        if arg.presence != "dynamic":
            spec.append(arg.name)
            continue
        if len(dynamic_inputs) != 1:
            raise ValueError(f"{proto.op_type}: dynamic output {arg.name!r} needs exactly one dynamic input to "
                             f"take its count from, the prototype has {dynamic_inputs}")
        spec.append((arg.name, len(values[dynamic_inputs[0]])))
    return spec


def _converter_signature(op: TorchOp, attr_names: tuple[str, ...]) -> inspect.Signature:
    """The torch op's arguments as Python parameters (tensors, then attributes with their defaults),
    then `meta_outputs`, which torchair passes."""
    positional, keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    tensors = [inspect.Parameter(arg.name, positional, default=None if arg.presence == "optional" else
                                 inspect.Parameter.empty) for arg in op.prototype.inputs]
    attr_kind = keyword if op.keyword_only_attrs else positional
    attrs = [inspect.Parameter(name, attr_kind, default=inspect.Parameter.empty if attr.default is None else
                               attr.default) for attr, name in zip(op.prototype.attrs, attr_names, strict=True)]
    return inspect.Signature([*tensors, *attrs, inspect.Parameter("meta_outputs", keyword, default=None)])


def _converter_makers() -> list[tuple[object, Callable[[ModuleType], Callable]]]:
    """(torch op overload, converter factory taking a `ge` namespace) for every op loaded now."""
    pairs = [(_overload(NAMESPACE, op.name), _maker(op, None)) for op in ops.OPS]
    pairs += [(_overload(CANN_NAMESPACE, op.name), _maker(op, op.cann_attr_names)) for op in ops.OPS
              if op.cann_attr_names is not None]
    return [(overload, make) for overload, make in pairs if overload is not None]


def _maker(op: TorchOp, attr_names: Sequence[str] | None) -> Callable[[ModuleType], Callable]:
    return lambda ge: make_converter(op, ge, attr_names)


def local_converters() -> dict[object, Callable]:
    """torch op overload -> converter emitting into the local `ge` graph builder. The tensor ops (the read)
    become nodes of their own types, which only the local GE runs: CANN's GE has no such op, so torchair
    gets other converters for them."""
    tensor_ops = [(_overload(NAMESPACE, op.name), _maker(op, None)) for op in ops.TENSOR_OPS]
    return {op: make(local_ge) for op, make in _converter_makers() + tensor_ops if op is not None}


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
    for op, convert in _torchair_converters(torchair):
        if op in done:
            continue
        torchair.register_fx_node_ge_converter(op)(convert)
        done.add(op)
        newly.append(op)
    return newly


def _torchair_converters(torchair: ModuleType) -> list[tuple[object, Callable]]:
    """(torch op overload, converter emitting through torchair) for every op loaded now: the registry's
    through torchair.ge, the tensor ops' through CANN's ops (torchair's GE op builders, ge_apis)."""
    pairs = [(op, make(torchair.ge)) for op, make in _converter_makers()]
    def raw_ops() -> ModuleType:  # looked up when a read is converted: torchair's GE op builders
        return importlib.import_module(f"{torchair.__name__}._ge_concrete_graph.ge_apis")

    forward = make_converter(ops.BLOCK_ATTENTION_RESIDUALS, torchair.ge)
    backward = make_converter(ops.BLOCK_ATTENTION_RESIDUALS_GRAD, torchair.ge)
    update = make_converter(ops.BLOCK_ATTN_RES_UPDATE, torchair.ge)
    reads = [(_overload(NAMESPACE, ops.READ_OP.name), make_read_converter(raw_ops, forward)),
             (_overload(NAMESPACE, ops.READ_GRAD_OP.name), make_read_grad_converter(raw_ops, backward)),
             (_overload(NAMESPACE, ops.UPDATE_NORM_OP.name), make_update_norm_converter(raw_ops, update))]
    return pairs + [(op, convert) for op, convert in reads if op is not None]


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
