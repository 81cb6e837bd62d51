"""One no-grad forward of a model's residual stream at (T, D, L, B): L layers, a seal every B; float32.

The sublayers' outputs are given, so that the stream's reads, seals and storage are timed, both ways:
  stream-per-layer  ResidualStream(two_phase=False): a block_attention_residuals per read
  stream-two-phase  each seal names its readers: a block_attn_res_prepare per seal, an update per read
against a copy of the snapshots' size, over the traffic model of stream_traffic (the planes each step must read
and write); the closing table gives its speedup as for a block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from attnres_ge.bench.cases.common import NORM_EPS
from attnres_ge.bench.paths import kernel_path, two_phase_path

STREAM_PROVIDERS = ("stream-per-layer", "stream-two-phase")


def stream_traffic(tokens: int, hidden: int, layers: int, block_size: int) -> dict[str, int]:
    """The traffic model of one forward of the stream (StreamCase) in float32 elements: the [T, D] planes each
    step must read and write, walking the schedule. Per-layer: a read with n sealed n + 2 (none with nothing
    sealed: live itself), an accumulate 3 (none right after a seal: out becomes live), a seal 2. Two-phase: the
    float32 live stream 2, a read with nothing sealed 2 (a copy of live), a seal 3 (live into its slot, live
    zeroed) and its prepare n + R (R its readers), a read 5 (an update), an accumulate none (the next update
    adds it)."""
    per_layer, two_phase = 0, 2  # two-phase: the embeddings into the float32 live stream
    sealed = 0
    for layer in range(layers):
        per_layer += sealed + 2 if sealed else 0
        two_phase += 5 if sealed else 2
        if layer % block_size == 0:
            sealed += 1
            readers = 2 * min(block_size, layers - layer)  # the mlp read of this layer ... the next attn read
            per_layer += 2
            two_phase += 3 + sealed + readers
        per_layer += 0 if layer % block_size == 0 else 3  # the attention output
        per_layer += sealed + 2 + 3  # the mlp read, the mlp output
        two_phase += 5
    per_layer += sealed + 2  # the final read
    two_phase += 5
    plane = tokens * hidden
    return {"stream-per-layer": per_layer * plane, "stream-two-phase": two_phase * plane}


class StreamCase:
    """One no-grad forward of a K3-style stack of L layers on a ResidualStream (a seal every B layers, reads
    before attention and MLP, a final read) at (T, D, L, B), all float32. The sublayers are left out: their
    outputs are given, so the stream alone is timed, with the copies and adds its storage needs.

    stream-per-layer: two_phase=False (each read one block_attention_residuals).
    stream-two-phase: each seal declares the reads up to the next one (one prepare, then an update per read)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0):
        from attnres_ge.api import BlockAttnRes

        tokens, hidden, layers, block_size = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.embeddings = torch.randn(tokens, hidden, generator=generator)
        self.outputs = [0.5 * torch.randn(tokens, hidden, generator=generator) for _ in range(2)]
        self.mixers = [BlockAttnRes(hidden, norm_eps=NORM_EPS) for _ in range(2 * layers + 1)]  # attn, mlp, ..., final
        with torch.no_grad():
            for mixer in self.mixers:
                mixer.proj_weight.copy_(0.5 * torch.randn(1, hidden, generator=generator) / hidden**0.5)

    @property
    def seals(self) -> int:
        _, _, layers, block_size = self.shape
        return -(-layers // block_size)

    def copy_elements(self) -> int:
        tokens, hidden, _, _ = self.shape
        return tokens * self.seals * hidden  # the snapshots' size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return 4 * stream_traffic(*self.shape)[provider]

    def path(self, provider: str) -> str:
        return kernel_path() if provider == "stream-per-layer" else two_phase_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return {"forward": functools.partial(self.forward, name == "stream-two-phase")}

    def readers(self, layer: int) -> list:
        """The reads from the seal in `layer` to the next seal, in order."""
        _, _, layers, block_size = self.shape
        end = min(layer + block_size, layers)
        return self.mixers[2 * layer + 1: 2 * end + 1]

    def forward(self, two_phase: bool) -> torch.Tensor:
        from attnres_ge.stream import ResidualStream

        _, _, layers, block_size = self.shape
        with torch.no_grad():
            stream = ResidualStream(self.embeddings, max_blocks=self.seals, two_phase=two_phase)
            for layer in range(layers):
                stream.read(self.mixers[2 * layer])
                if layer % block_size == 0:
                    stream.seal(readers=self.readers(layer) if two_phase else None)
                stream.accumulate(self.outputs[0])
                stream.read(self.mixers[2 * layer + 1])
                stream.accumulate(self.outputs[1])
            return stream.read(self.mixers[-1])
