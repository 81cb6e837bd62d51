"""The ops of this package: one entry each, which the torch op definitions, the converters, the local GE,
the NPU dispatch, the CLI, the benchmark and the prototype export iterate.

An entry joins an op's layers: its kernels (op_kernel/<op>.py's KERNEL, which carries its prototype
and tiling), its torch op name and how its torch schema spells what the prototype holds. Everything
else about the op is derived from the prototype: the torch schema (`TorchOp.schema`), the eager and
fake implementations (op_common.define_op) and the GE converter (converters.make_converter). Adding
an op means writing its files in each layer and one entry in OPS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnres_ge.op_kernel import OpKernel
from attnres_ge.op_kernel.block_attention_residuals import KERNEL as FORWARD_KERNEL
from attnres_ge.op_kernel.block_attention_residuals_grad import KERNEL as BACKWARD_KERNEL
from attnres_ge.op_kernel.block_attn_res_prepare import KERNEL as PREPARE_KERNEL
from attnres_ge.op_kernel.block_attn_res_read import READ_GRAD_KERNEL, READ_KERNEL
from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL
from attnres_ge.op_kernel.block_attn_res_update_norm import UPDATE_NORM_KERNEL
from attnres_ge.op_kernel.kernel_spec import TensorKernel
from attnres_ge.op_proto import OpPrototype

NAMESPACE = "attnres"  # the torch ops are torch.ops.attnres.<name>
CANN_NAMESPACE = "cann_ops_transformer"  # CANN's own (eager-only) torch ops, of the same names, on Ascend
# A prototype attribute's kind -> its type in a torch schema.
SCHEMA_TYPES = {"Int": "int", "Float": "float", "Bool": "bool", "Str": "str"}

# (dims by letter, dtype) -> (input tensors, attributes): one call of the op, for the benchmark.
BenchInputs = Callable[[dict[str, int], torch.dtype], tuple[tuple[torch.Tensor, ...], dict]]


@dataclass(frozen=True)
class TorchOp:
    """One op as PyTorch and GE graphs see it.

    kernel             its kernels, prototype and tiling
    name               the torch op name: torch.ops.attnres.<name>
    keyword_only_attrs the schema lists the attributes after `*` (as CANN's torch op does)
    named_outputs      the schema names its returns
    cann_attr_names    where CANN ships torch.ops.cann_ops_transformer.<name>: its spelling of the
                       prototype's attributes, in prototype order (None: CANN ships no torch op)
    autograd           the module that registers the op's derivative (or its refusal to have one),
                       imported once every op is defined; None: the op has no Autograd kernel of its own
    bench_inputs       inputs for `attnres-ge bench --ops <name>`, for an op the bench has no case family of its
                       own for (None: not timed generically; attnres_ge/bench/cases/op.py)
    """

    kernel: OpKernel | TensorKernel
    name: str
    keyword_only_attrs: bool = False
    named_outputs: bool = False
    cann_attr_names: tuple[str, ...] | None = None
    autograd: str | None = None
    bench_inputs: BenchInputs | None = None

    @property
    def op_type(self) -> str:
        return self.kernel.op_type

    @property
    def prototype(self) -> OpPrototype:
        return self.kernel.prototype

    def returned_outputs(self) -> list[str]:
        """The outputs the torch op returns, in order: all but the reference outputs (inputs updated in place)."""
        return [arg.name for arg in self.prototype.outputs if not self.prototype.is_reference_output(arg.name)]

    def schema(self) -> str:
        """The torch schema, without the name: `(arguments) -> returns`, from the prototype."""
        return torch_schema(self.prototype, self.keyword_only_attrs, self.named_outputs)


def torch_schema(proto: OpPrototype, keyword_only_attrs: bool, named_outputs: bool) -> str:
    """`(arguments) -> returns` of a torch op for `proto`: its inputs then its attributes (after `*` when
    keyword-only), returning every output that is not a reference output (named when `named_outputs`)."""
    arguments = [_tensor_argument(arg.name, arg.presence, proto.is_reference_output(arg.name))
                 for arg in proto.inputs]
    attributes = [_attribute_argument(attr.name, attr.kind, attr.default) for attr in proto.attrs]
    if keyword_only_attrs and attributes:
        attributes.insert(0, "*")
    returns = [_tensor_type(arg.presence) + (f" {arg.name}" if named_outputs else "")
               for arg in proto.outputs if not proto.is_reference_output(arg.name)]
    returned = returns[0] if len(returns) == 1 else f"({', '.join(returns)})"
    return f"({', '.join(arguments + attributes)}) -> {returned}"


def _tensor_type(presence: str) -> str:
    return "Tensor[]" if presence == "dynamic" else "Tensor"


def _tensor_argument(name: str, presence: str, updated_in_place: bool) -> str:
    alias = "(a!)" if updated_in_place else ""
    if presence == "optional":
        return f"Tensor{alias}? {name}=None"
    return f"{_tensor_type(presence)}{alias} {name}"


def _attribute_argument(name: str, kind: str, default) -> str:
    declared = f"{SCHEMA_TYPES[kind]} {name}"
    if default is None:
        return declared
    return f'{declared}="{default}"' if kind == "Str" else f"{declared}={default!r}"


BLOCK_ATTENTION_RESIDUALS = TorchOp(
    FORWARD_KERNEL, "block_attention_residuals", cann_attr_names=("validBlockNum", "normEps", "needBackward"),
    autograd="attnres_ge.ge_plugin.block_attention_residuals")
BLOCK_ATTENTION_RESIDUALS_GRAD = TorchOp(
    BACKWARD_KERNEL, "block_attention_residuals_backward", keyword_only_attrs=True,
    cann_attr_names=("valid_block_num",), autograd="attnres_ge.ge_plugin.block_attention_residuals_grad")

# The two-phase pair (CANN's names: cann_ops_transformer.block_attn_res_prepare / _update).
BLOCK_ATTN_RES_PREPARE = TorchOp(
    PREPARE_KERNEL, "block_attn_res_prepare", keyword_only_attrs=True, named_outputs=True, cann_attr_names=("eps",),
    autograd="attnres_ge.ge_plugin.block_attn_res_prepare")
BLOCK_ATTN_RES_UPDATE = TorchOp(
    UPDATE_KERNEL, "block_attn_res_update", keyword_only_attrs=True, cann_attr_names=("eps",),
    autograd="attnres_ge.ge_plugin.block_attn_res_update")

OPS: tuple[TorchOp, ...] = (
    BLOCK_ATTENTION_RESIDUALS,
    BLOCK_ATTENTION_RESIDUALS_GRAD,
    BLOCK_ATTN_RES_PREPARE,
    BLOCK_ATTN_RES_UPDATE,
)


# Ops whose kernels take their tensors where they lie (a TensorKernel), this package's own (CANN has none), so
# nothing of the registry's per-signature machinery (op_common, the C++ entry, the benchmark) applies to them:
# the general read, whose Tensor[] input is read in place, and the two-phase update with a fused output norm,
# which runs the update's plans itself. Their modules define their torch ops (block_attn_res_read.py,
# block_attn_res_update_norm.py); the local GE and the converters take them from here with the registry's ops.
READ_OP = TorchOp(READ_KERNEL, "block_attn_res_read", keyword_only_attrs=True, named_outputs=True)
READ_GRAD_OP = TorchOp(READ_GRAD_KERNEL, "block_attn_res_read_backward", keyword_only_attrs=True, named_outputs=True)
UPDATE_NORM_OP = TorchOp(UPDATE_NORM_KERNEL, "block_attn_res_update_norm", keyword_only_attrs=True)
TENSOR_OPS: tuple[TorchOp, ...] = (READ_OP, READ_GRAD_OP, UPDATE_NORM_OP)


def op_for_type(op_type: str) -> TorchOp:
    """The entry of GE op type `op_type` (a registry op or a tensor op); KeyError names the known types."""
    for op in (*OPS, *TENSOR_OPS):
        if op.op_type == op_type:
            return op
    known = sorted(op.op_type for op in (*OPS, *TENSOR_OPS))
    raise KeyError(f"no op registered for op type {op_type!r}; known: {known}")


def op_named(name: str) -> TorchOp:
    """The entry whose torch op name or GE op type is `name`; KeyError names the known ones."""
    for op in OPS:
        if name in (op.name, op.op_type):
            return op
    raise KeyError(f"no op named {name!r}; known: {sorted(op.name for op in OPS)}")
