"""The ops of this package: one entry each, which the converters, the local GE, the NPU dispatch
and the prototype export iterate.

An entry joins an op's layers: its kernels (op_kernel/<op>.py's KERNEL, which carries its
prototype and tiling), its torch op name and its converter module. Adding an op means writing
its files in each layer and one entry here; its torch op module (ge_plugin/<op>.py, imported by
ge_plugin/__init__) defines the torch op from its entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from attnres_ge.ge_plugin import (
    block_attention_residuals_converter,
    block_attention_residuals_grad_converter,
    block_attn_res_prepare_converter,
    block_attn_res_update_converter,
)
from attnres_ge.op_kernel import OpKernel
from attnres_ge.op_kernel.block_attention_residuals import KERNEL as FORWARD_KERNEL
from attnres_ge.op_kernel.block_attention_residuals_grad import KERNEL as BACKWARD_KERNEL
from attnres_ge.op_kernel.block_attn_res_prepare import KERNEL as PREPARE_KERNEL
from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL
from attnres_ge.op_proto import OpPrototype

NAMESPACE = "attnres"  # the torch ops are torch.ops.attnres.<name>
CANN_NAMESPACE = "cann_ops_transformer"  # CANN's own (eager-only) torch ops, of the same names, on Ascend


@dataclass(frozen=True)
class TorchOp:
    """One op as PyTorch and GE graphs see it: its kernels (prototype, tiling), the torch op name
    (`torch.ops.attnres.<name>`, also the name of CANN's own torch op under
    `torch.ops.cann_ops_transformer` where CANN ships one) and its converter module
    (`make_converter(ge)`, and `make_cann_converter(ge)` for an op CANN ships).

    `bench_inputs`, optional, lets `attnres-ge bench` time an op it has no case of its own for:
    `bench_inputs(dims, dtype) -> (input tensors, attributes)` for a shape given by its letters
    (e.g. {"T": 4096, "H": 2048}); see attnres_ge/bench/cases/op.py."""

    kernel: OpKernel
    name: str
    converter: ModuleType
    bench_inputs: Callable | None = None

    @property
    def op_type(self) -> str:
        return self.kernel.op_type

    @property
    def prototype(self) -> OpPrototype:
        return self.kernel.prototype


BLOCK_ATTENTION_RESIDUALS = TorchOp(FORWARD_KERNEL, "block_attention_residuals", block_attention_residuals_converter)
BLOCK_ATTENTION_RESIDUALS_GRAD = TorchOp(BACKWARD_KERNEL, "block_attention_residuals_backward",
                                         block_attention_residuals_grad_converter)

# The two-phase pair (CANN's names: cann_ops_transformer.block_attn_res_prepare / _update).
BLOCK_ATTN_RES_PREPARE = TorchOp(PREPARE_KERNEL, "block_attn_res_prepare", block_attn_res_prepare_converter)
BLOCK_ATTN_RES_UPDATE = TorchOp(UPDATE_KERNEL, "block_attn_res_update", block_attn_res_update_converter)

OPS: tuple[TorchOp, ...] = (BLOCK_ATTENTION_RESIDUALS, BLOCK_ATTENTION_RESIDUALS_GRAD, BLOCK_ATTN_RES_PREPARE,
                            BLOCK_ATTN_RES_UPDATE)


def op_for_type(op_type: str) -> TorchOp:
    """The entry of GE op type `op_type`; KeyError names the known types."""
    for op in OPS:
        if op.op_type == op_type:
            return op
    raise KeyError(f"no op registered for op type {op_type!r}; known: {sorted(op.op_type for op in OPS)}")
