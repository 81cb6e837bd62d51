"""The per-layer op (block_attention_residuals and its backward) at (T, N, H), against PyTorch.

For each named shape and dtype, the forwards of all providers, then their backwards, are timed in rounds: each
round times every provider's call right after a copy of its own. Minimum traffic (elements, each read or written
once): forward (N+2) T H, backward (2N+3) T H. The copy moves 2 (N+1) T H elements (the value stack read and
written).

Providers:
  op-eager       torch.ops.attnres.* with fresh outputs each call (what eager training runs)
  op-graph       the same ops through torch.compile(backend="attnres_ge"): converter, local GE,
                 outputs and workspace planned per shape and reused (the graph path)
  kernel         the kernels alone, outputs and workspace allocated once, launched from a record
                 prepared once (as the runtime launches them): the floor both op paths stand on;
                 op time minus kernel time is the per-call overhead
  read           torch.sum of a float32 tensor of as many bytes as the pass moves: the host merely
                 reading that traffic, a reference for the read-heavy forward (it reads N+1 of its
                 N+2 rows), whose kernel does at least that and more arithmetic
  torch-eager    the plain formula (concatenate, RMS-norm, softmax, weighted sum) and its autograd
  torch-inductor torch.compile of a concatenation-free formula, forward and autograd backward
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from attnres_ge.bench.cases.common import NORM_EPS
from attnres_ge.bench.harness import Measurement, measure_case
from attnres_ge.bench.paths import kernel_path
from attnres_ge.shapes import DTYPES

READ = "read"  # not ours and not PyTorch's formula: the host's streaming-read speed, beside ours in the plot
PROVIDERS = ("op-eager", "op-graph", "kernel", READ, "torch-eager", "torch-inductor")
OUR_PROVIDERS = ("op-eager", "op-graph", "kernel")
BASELINES = ("torch-eager", "torch-inductor")


def plain_formula(partial_block, block_res, proj_weight, norm_weight):
    """What one writes first: concatenate the rows, RMS-norm, score, softmax, mix (float32 maths)."""
    values = torch.cat([block_res, partial_block.unsqueeze(1)], dim=1).float()  # [T, N+1, H]
    inv_norm = torch.rsqrt(values.pow(2).mean(dim=-1) + NORM_EPS)
    scores = inv_norm * (values * (norm_weight.float() * proj_weight.reshape(-1).float())).sum(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    return (probs.unsqueeze(-1) * values).sum(dim=1).to(partial_block.dtype)


def concat_free_formula(partial_block, block_res, proj_weight, norm_weight):
    """The same maths with the partial block kept apart: no [T, N+1, H] concatenation for inductor to copy."""
    weight = norm_weight.float() * proj_weight.reshape(-1).float()  # [H]
    blocks, partial = block_res.float(), partial_block.float()
    block_scores = torch.rsqrt(blocks.pow(2).mean(-1) + NORM_EPS) * (blocks * weight).sum(-1)  # [T, N]
    partial_score = torch.rsqrt(partial.pow(2).mean(-1, keepdim=True) + NORM_EPS) * (partial * weight).sum(
        -1, keepdim=True)  # [T, 1]
    top = torch.maximum(block_scores.amax(-1, keepdim=True), partial_score)
    block_exp, partial_exp = torch.exp(block_scores - top), torch.exp(partial_score - top)
    total = block_exp.sum(-1, keepdim=True) + partial_exp
    mixed = ((block_exp / total).unsqueeze(-1) * blocks).sum(1) + (partial_exp / total) * partial
    return mixed.to(partial_block.dtype)


class Case:
    """Inputs of one (shape, dtype) and the forward/backward callables of each provider."""

    directions = ("forward", "backward")

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0):
        tokens, blocks, hidden = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape, self.dtype = shape, dtype
        self.inputs = (
            torch.randn(tokens, hidden, generator=generator).to(dtype),
            torch.randn(tokens, blocks, hidden, generator=generator).to(dtype),
            (0.5 * torch.randn(1, hidden, generator=generator) / hidden**0.5).to(dtype),
            (1 + 0.2 * torch.randn(hidden, generator=generator)).to(dtype),
        )
        self.grad_hidden = torch.randn(tokens, hidden, generator=generator).to(dtype)
        _, self.inv_norm, self.probs = torch.ops.attnres.block_attention_residuals(*self.inputs, -1, NORM_EPS, True)

    def traffic(self, direction: str) -> int:
        tokens, blocks, hidden = self.shape
        elements = (blocks + 2 if direction == "forward" else 2 * blocks + 3) * tokens * hidden
        return elements * self.inputs[0].element_size()

    def copy_elements(self) -> int:
        tokens, blocks, hidden = self.shape
        return tokens * (blocks + 1) * hidden  # the value stack's size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return self.traffic(direction)

    def path(self, provider: str) -> str:
        return kernel_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return getattr(self, "_" + name.replace("-", "_"))()

    def _op_eager(self):
        ops = torch.ops.attnres
        return {
            "forward": lambda: ops.block_attention_residuals(*self.inputs, -1, NORM_EPS, True),
            "backward": lambda: ops.block_attention_residuals_backward(
                *self.inputs[:2], self.inputs[2], self.inputs[3], self.grad_hidden, self.inv_norm, self.probs),
        }

    def _op_graph(self):
        torch._dynamo.reset()  # a fresh cache per case: dynamo's recompile limit would silently fall back to eager
        return self.compiled_ops("attnres_ge")

    def compiled_ops(self, backend: str):
        """The op-eager calls under torch.compile(backend=...); "eager" leaves the ops as they are, which is
        what torch.compile itself costs a call of these ops."""
        ops = torch.ops.attnres

        def forward(partial_block, block_res, proj_weight, norm_weight):
            return ops.block_attention_residuals(partial_block, block_res, proj_weight, norm_weight, -1, NORM_EPS, True)

        def backward(*tensors):
            return ops.block_attention_residuals_backward(*tensors)

        compiled_forward = torch.compile(forward, backend=backend, fullgraph=True, dynamic=False)
        compiled_backward = torch.compile(backward, backend=backend, fullgraph=True, dynamic=False)
        stats = (self.grad_hidden, self.inv_norm, self.probs)
        return {
            "forward": lambda: compiled_forward(*self.inputs),
            "backward": lambda: compiled_backward(*self.inputs, *stats),
        }

    def _kernel(self):
        from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
        from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
        from attnres_ge.op_kernel import KERNELS
        from attnres_ge.op_kernel.block_attention_residuals import KERNEL as FORWARD_KERNEL
        from attnres_ge.op_kernel.block_attention_residuals_grad import KERNEL as BACKWARD_KERNEL
        from attnres_ge.op_kernel.host_memory import empty_planned
        from attnres_ge.op_kernel.launcher import default_runtime

        tokens, blocks, hidden = self.shape
        platform = default_runtime().platform
        platform.requery()
        forward = forward_tiling.tiling(forward_tiling.parse(platform), tokens, blocks, hidden, self.dtype, NORM_EPS,
                                        True, platform)
        backward = grad_tiling.tiling(grad_tiling.parse(platform), tokens, blocks, hidden, self.dtype, platform)
        stats = (tokens, blocks + 1)
        # Buffers as a compiled graph plans them (host_memory.empty_planned); records prepared once, no
        # per-call checks: launched as the runtime launches them.
        forward_out = (empty_planned(tuple(self.inputs[0].shape), self.dtype), torch.empty(stats), torch.empty(stats))
        backward_out = tuple(empty_planned(tuple(t.shape), t.dtype) for t in self.inputs)
        workspace = empty_planned((max(forward.workspace_size, backward.workspace_size),), torch.uint8)
        _, forward_launch = KERNELS.launch(FORWARD_KERNEL, forward.data, self.dtype)
        _, backward_launch = KERNELS.launch(BACKWARD_KERNEL, backward.data, self.dtype)
        backward_inputs = (*self.inputs, self.grad_hidden, self.inv_norm, self.probs)
        return {
            "forward": lambda: forward_launch(self.inputs, forward_out, workspace),
            "backward": lambda: backward_launch(backward_inputs, backward_out, workspace),
        }

    def _read(self):
        sources = {direction: torch.ones(self.traffic(direction) // 4) for direction in ("forward", "backward")}
        return {direction: functools.partial(torch.sum, source) for direction, source in sources.items()}

    def _autograd_pair(self, function):
        leaves = [t.detach().requires_grad_() for t in self.inputs]
        output = function(*leaves)  # the graph the backward replays
        return {
            "forward": lambda: function(*self.inputs),
            "backward": lambda: torch.autograd.grad(output, leaves, self.grad_hidden, retain_graph=True),
        }

    def _torch_eager(self):
        return self._autograd_pair(plain_formula)

    def _torch_inductor(self):
        torch._dynamo.reset()  # as in _op_graph
        return self._autograd_pair(torch.compile(concat_free_formula, dynamic=False))


def measure(shape_name: str, shape: tuple[int, int, int], dtype_name: str, providers, rounds: int, retries: int = 2,
            log=print) -> list[Measurement]:
    """Every provider's forward, then backward, timed in shared rounds; rounds run again while disturbed."""
    return measure_case(Case(shape, DTYPES[dtype_name]), shape_name, dtype_name, providers, rounds, retries, log)
