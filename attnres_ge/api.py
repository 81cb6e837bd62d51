"""The friendly entry points: a differentiable function and a per-layer nn.Module.

Above the torch ops, which keep CANN's contract (2-D/3-D tensors, one dtype), they take what model
code holds (docs/using.md states the rules):
- leading dims: partial_block [..., H] with block_res [..., N, H] or a list/tuple of N tensors [..., H];
  flattened to tokens for the op and shaped back;
- dtypes: the op runs in the activations' dtype (partial_block and the blocks, promoted as torch
  promotes them); parameters of another dtype (fp32 master weights under AMP) are cast to it for the
  op, so their gradients come back in their own dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import attnres_ge.ge_plugin  # noqa: F401  (defines the torch ops)

_FUNCTION = "block_attention_residuals"
_OP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{_FUNCTION}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _stack_blocks(blocks: Sequence, partial_block: torch.Tensor) -> torch.Tensor:
    """A list/tuple of N block tensors [..., H] -> [..., N, H] in their promoted dtype."""
    if len(blocks) == 0:
        raise ValueError(f"{_FUNCTION}: block_res is an empty {type(blocks).__name__}; the forward needs at least "
                         "one completed block (N >= 1)")
    blocks = [_require_tensor(f"block_res[{index}]", block) for index, block in enumerate(blocks)]
    for index, block in enumerate(blocks):
        if block.shape != partial_block.shape:
            raise ValueError(f"{_FUNCTION}: block_res[{index}] has shape {list(block.shape)}, expected the shape of "
                             f"partial_block {list(partial_block.shape)} ([..., H])")
    dtype = blocks[0].dtype
    for block in blocks[1:]:
        dtype = torch.promote_types(dtype, block.dtype)
    return torch.stack([block.to(dtype) for block in blocks], dim=-2)


def _flatten(partial_block: torch.Tensor, block_res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """partial_block [..., H], block_res [..., N, H] -> [T, H], [T, N, H], or a clear error naming both shapes."""
    if partial_block.dim() < 1 or block_res.dim() < 2 or (
        partial_block.shape[:-1] != block_res.shape[:-2] or partial_block.shape[-1] != block_res.shape[-1]
    ):
        raise ValueError(
            f"{_FUNCTION}: partial_block {list(partial_block.shape)} and block_res {list(block_res.shape)} do not "
            "match: expected partial_block [..., H] and block_res [..., N, H] with the same leading dims and H"
        )
    hidden = partial_block.shape[-1]
    return partial_block.reshape(-1, hidden), block_res.reshape(-1, block_res.shape[-2], hidden)


def _compute_dtype(partial_block: torch.Tensor, block_res: torch.Tensor, proj_weight, norm_weight) -> torch.dtype:
    """The activations' promoted dtype; a clear error for a dtype the op cannot run (float64 among them)."""
    dtype = partial_block.dtype
    if block_res.dtype != dtype:
        dtype = torch.promote_types(dtype, block_res.dtype)
    named = (("activations (partial_block, block_res)", dtype), ("proj_weight", proj_weight.dtype),
             ("norm_weight", norm_weight.dtype))
    for name, tensor_dtype in named:
        if tensor_dtype not in _OP_DTYPES:
            raise TypeError(
                f"{_FUNCTION}: {name} dtype {tensor_dtype} is not supported; the op runs in float32, float16 or "
                "bfloat16 (parameters of another of those dtypes are cast to the activations' dtype)"
            )
    return dtype


def block_attention_residuals(
    partial_block: torch.Tensor,
    block_res: torch.Tensor | Sequence[torch.Tensor],
    proj_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    *,
    norm_eps: float = 1e-6,
    valid_block_num: int = -1,
    return_probs: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mix N completed blocks and the partial block with a learned softmax over depth.

    Args:
        partial_block: [..., H] the running sum inside the current block.
        block_res: [..., N, H] the N completed block representations, or a list/tuple of N tensors
            [..., H] (stacked: one copy).
        proj_weight: [1, H] or [H] the layer's pseudo-query.
        norm_weight: [H] the RMS-norm weight applied to the keys.
        norm_eps: RMS-norm epsilon, finite and > 0.
        valid_block_num: reserved by the CANN op: -1 or N.
        return_probs: also return the depth weights probs [..., N+1] (float32, the partial block last),
            differentiable like hidden_states.

    The op runs in the activations' dtype (partial_block and block_res promoted); float32, float16 or
    bfloat16 parameters of another dtype are cast to it, and their gradients come back in their own dtype.

    Returns:
        hidden_states [..., H] in the activations' dtype, or (hidden_states, probs) with return_probs;
        differentiable in all four tensors, to any order.
    """
    _require_tensor("partial_block", partial_block)
    if not isinstance(block_res, torch.Tensor):
        if not isinstance(block_res, (list, tuple)):
            raise TypeError(f"{_FUNCTION}: block_res must be a torch.Tensor [..., N, H] or a list/tuple of N tensors "
                            f"[..., H], got {type(block_res).__name__}")
        block_res = _stack_blocks(block_res, partial_block)
    _require_tensor("proj_weight", proj_weight)
    _require_tensor("norm_weight", norm_weight)
    leading_shape = None
    if partial_block.dim() != 2 or block_res.dim() != 3:
        leading_shape = partial_block.shape[:-1]
        partial_block, block_res = _flatten(partial_block, block_res)
    dtype = partial_block.dtype
    if block_res.dtype != dtype or proj_weight.dtype != dtype or norm_weight.dtype != dtype or dtype not in _OP_DTYPES:
        dtype = _compute_dtype(partial_block, block_res, proj_weight, norm_weight)
        partial_block, block_res = partial_block.to(dtype), block_res.to(dtype)
        proj_weight, norm_weight = proj_weight.to(dtype), norm_weight.to(dtype)
    # The statistics are kept when a backward may follow, and always while torch.jit.trace records (its
    # check re-runs the function without grad, and a recorded constant must not depend on that).
    need_backward = return_probs or torch.jit.is_tracing() or (
        torch.is_grad_enabled()
        and (partial_block.requires_grad or block_res.requires_grad or proj_weight.requires_grad
             or norm_weight.requires_grad)
    )
    # The overload itself: resolving the packet costs every call several microseconds.
    hidden_states, _, probs = torch.ops.attnres.block_attention_residuals.default(
        partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps, need_backward
    )
    if leading_shape is not None:
        hidden_states = hidden_states.reshape(*leading_shape, hidden_states.shape[-1])
        probs = probs.reshape(*leading_shape, probs.shape[-1]) if return_probs else probs
    return (hidden_states, probs) if return_probs else hidden_states


class BlockAttnRes(nn.Module):
    """One layer's Block AttnRes: owns the pseudo-query `proj_weight` [1, H] and key-norm `norm_weight` [H].

    The pseudo-query starts at zero, so a fresh layer averages its inputs uniformly (reset_parameters).
    Parameters may stay float32 while activations are float16/bfloat16 (see block_attention_residuals).
    """

    def __init__(self, hidden_size: int, *, norm_eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.norm_eps = norm_eps
        self.proj_weight = nn.Parameter(torch.empty(1, hidden_size, **factory))
        self.norm_weight = nn.Parameter(torch.empty(hidden_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """proj_weight zeros, norm_weight ones (also what to call after `to_empty` from the meta device)."""
        nn.init.zeros_(self.proj_weight)
        nn.init.ones_(self.norm_weight)

    def forward(
        self,
        partial_block: torch.Tensor,
        block_res: torch.Tensor | Sequence[torch.Tensor],
        *,
        valid_block_num: int = -1,
        return_probs: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """partial_block [..., H], block_res [..., N, H] or N x [..., H] -> hidden_states [..., H]
        (and probs [..., N+1] with return_probs)."""
        return block_attention_residuals(
            partial_block,
            block_res,
            self.proj_weight,
            self.norm_weight,
            norm_eps=self.norm_eps,
            valid_block_num=valid_block_num,
            return_probs=return_probs,
        )

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, norm_eps={self.norm_eps}"
