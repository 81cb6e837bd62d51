"""The two-phase ops (block_attn_res_prepare, block_attn_res_update, block_attn_res_update_norm) at (T, N, S, D),
float32.

Named T_N_S_D (float32, delta too), timed by the same rounds as the per-layer op, against a copy of block_res's
size, over their minimum traffic (every tensor with a token dimension read or written once; the pseudo-queries,
which have none, left out):
  prepare-eager, prepare-graph   block_attn_res_prepare: N T D read, S T D + 2 S T written
  update-eager, update-graph     block_attn_res_update on prepare's first slot: partial_block, delta, numerator
                                 read, partial_block and h written (5 T D), logit_max and exp_sum read
  update_norm-eager, -graph      block_attn_res_update_norm there (h normed by an RMSNorm): the update's traffic
  update+rms_norm-eager          block_attn_res_update, then F.rms_norm of h (the pair it fuses): h read and
                                 written once more (7 T D)
(-graph: through torch.compile(backend="attnres_ge")). Their path is the native kernels' (it would read "python"
for an op without a native kernel, which --paths then times on the first path alone).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnres_ge.bench.cases.common import NORM_EPS, compiled_op
from attnres_ge.bench.paths import two_phase_path

TWO_PHASE_PROVIDERS = ("prepare-eager", "prepare-graph", "update-eager", "update-graph", "update_norm-eager",
                       "update_norm-graph", "update+rms_norm-eager")
UNFUSED_NORM = "update+rms_norm"


def prepare_traffic(tokens: int, blocks: int, readers: int, hidden: int) -> int:
    """Prepare's minimum traffic in float32 elements: block_res read, numerator, logit_max and exp_sum written."""
    return blocks * tokens * hidden + readers * tokens * hidden + 2 * readers * tokens


def update_traffic(tokens: int, hidden: int, delta_size: int = 4) -> int:
    """Update's minimum traffic in bytes: partial_block, numerator (float32), delta read, partial_block (float32)
    and h (delta's dtype) written, logit_max and exp_sum read."""
    return tokens * hidden * (3 * 4 + 2 * delta_size) + 2 * tokens * 4


class TwoPhaseCase:
    """Inputs of block_attn_res_prepare and block_attn_res_update at one (T, N, S, D), all float32, and each
    provider's call ("forward": the ops are inference-only)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0):
        tokens, blocks, readers, hidden = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.block_res = torch.randn(tokens, blocks, hidden, generator=generator)
        self.valid_blocks = torch.tensor([blocks], dtype=torch.uint64)
        self.pseudo_query = 0.5 * torch.randn(readers, hidden, generator=generator) / hidden**0.5
        self.partial = torch.randn(tokens, hidden, generator=generator)
        self.delta = torch.randn(tokens, hidden, generator=generator)
        self.output_norm_weight = 1 + 0.1 * torch.randn(hidden, generator=generator)
        self.state = torch.ops.attnres.block_attn_res_prepare(self.block_res, self.valid_blocks, self.pseudo_query,
                                                              eps=NORM_EPS)

    def copy_elements(self) -> int:
        tokens, blocks, _, hidden = self.shape
        return tokens * blocks * hidden  # block_res's size

    def provider_traffic(self, direction: str, provider: str) -> int:
        tokens, blocks, readers, hidden = self.shape
        if provider.startswith("prepare"):
            return 4 * prepare_traffic(tokens, blocks, readers, hidden)
        if provider.startswith(UNFUSED_NORM):  # h read once more and its normed copy written
            return update_traffic(tokens, hidden) + 2 * 4 * tokens * hidden
        return update_traffic(tokens, hidden)

    def path(self, provider: str) -> str:
        return two_phase_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        op_name, mode = name.split("-")
        if op_name == "prepare":
            arguments = (self.block_res, self.valid_blocks, self.pseudo_query)
        else:  # the first reader's slot; partial is updated in place, call after call
            arguments = (self.partial, self.delta, self.pseudo_query[0], *(part[0] for part in self.state))
        if op_name == UNFUSED_NORM:
            return {"forward": functools.partial(self._update_then_norm, *arguments)}
        if op_name == "update_norm":
            arguments = (*arguments, self.output_norm_weight)
        op = getattr(torch.ops.attnres, f"block_attn_res_{op_name}")
        call = functools.partial(op, eps=NORM_EPS) if mode == "eager" else compiled_op(op, eps=NORM_EPS)
        return {"forward": functools.partial(call, *arguments)}

    def _update_then_norm(self, *arguments) -> torch.Tensor:
        h = torch.ops.attnres.block_attn_res_update(*arguments, eps=NORM_EPS)
        return F.rms_norm(h, (h.shape[-1],), self.output_norm_weight, NORM_EPS)
