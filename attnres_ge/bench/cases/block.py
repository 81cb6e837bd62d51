"""One block of a model at (T, N, D, R), float32, timed both ways against a copy of the snapshots' size:
  block-per-layer   R times: live += delta, then block_attention_residuals over the N snapshots and live
  block-two-phase   one block_attn_res_prepare for the R readers, then R block_attn_res_update calls
The traffic model counts [T, D] planes: R (N + 5) per-layer against N + 6 R two-phase; the table closing the run
gives the measured speedup of the two-phase block beside the model's ratio. The registry's default block shapes
are timed by default, --all-blocks times every one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnres_ge.bench.cases.common import NORM_EPS
from attnres_ge.bench.paths import kernel_path, two_phase_path

BLOCK_PROVIDERS = ("block-per-layer", "block-two-phase")


def block_traffic(tokens: int, blocks: int, hidden: int, reads: int) -> dict[str, int]:
    """The traffic model of one block in float32 elements, counting [T, D] planes: per-layer, each read adds its
    delta to live (3 planes) and reads N snapshots and live and writes h (N + 2); two-phase, one prepare
    (N in, R out) and R updates (5 planes each)."""
    plane = tokens * hidden
    return {"block-per-layer": reads * (blocks + 5) * plane, "block-two-phase": (blocks + 6 * reads) * plane}


class BlockCase:
    """One block of a model at (T, N, D, R): N sealed snapshots and R reads before the next seal, each read after
    a sublayer's output (delta) is added to the live stream; all float32.

    block-per-layer: per read, live += delta, then torch.ops.attnres.block_attention_residuals (no backward stats).
    block-two-phase: one block_attn_res_prepare for the R readers, then per read one block_attn_res_update (which
    adds the delta itself)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0):
        tokens, blocks, hidden, reads = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.snapshots = torch.randn(tokens, blocks, hidden, generator=generator)
        self.valid_blocks = torch.tensor([blocks], dtype=torch.uint64)
        self.live = torch.randn(tokens, hidden, generator=generator)
        self.deltas = [torch.randn(tokens, hidden, generator=generator) for _ in range(reads)]
        self.proj_weights = [0.5 * torch.randn(1, hidden, generator=generator) / hidden**0.5 for _ in range(reads)]
        self.norm_weights = [1 + 0.2 * torch.randn(hidden, generator=generator) for _ in range(reads)]
        self.pseudo_queries = torch.stack([n * p.reshape(-1) for n, p in zip(self.norm_weights, self.proj_weights,
                                                                              strict=True)])

    def copy_elements(self) -> int:
        tokens, blocks, hidden, _ = self.shape
        return tokens * blocks * hidden  # the snapshots' size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return 4 * block_traffic(*self.shape)[provider]

    def path(self, provider: str) -> str:
        return kernel_path() if provider == "block-per-layer" else two_phase_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return {"forward": self._per_layer_reads if name == "block-per-layer" else self._two_phase_reads}

    def _per_layer_reads(self) -> list[torch.Tensor]:
        read = torch.ops.attnres.block_attention_residuals
        outputs = []
        for delta, proj_weight, norm_weight in zip(self.deltas, self.proj_weights, self.norm_weights, strict=True):
            self.live.add_(delta)
            outputs.append(read(self.live, self.snapshots, proj_weight, norm_weight, -1, NORM_EPS, False)[0])
        return outputs

    def _two_phase_reads(self) -> list[torch.Tensor]:
        ops = torch.ops.attnres
        numerator, logit_max, exp_sum = ops.block_attn_res_prepare(self.snapshots, self.valid_blocks,
                                                                   self.pseudo_queries, eps=NORM_EPS)
        return [ops.block_attn_res_update(self.live, delta, query, numerator[slot], logit_max[slot], exp_sum[slot],
                                          eps=NORM_EPS)
                for slot, (delta, query) in enumerate(zip(self.deltas, self.pseudo_queries, strict=True))]
