"""ResidualStream through the real torchair: a model's no-grad forward, compiled as an Ascend user compiles it,
becomes one BlockAttnResPrepare node per seal and one BlockAttnResUpdate node per read after the first seal on the
two-phase path, and one BlockAttentionResiduals node per such read on the per-layer path.

The graphs also hold the stream's own bookkeeping (the seal's slot write, the pseudo-queries' product) and the
sublayers' stand-in (Tanh) as GE ops of torchair's converters, which the stand-in cannot run: these tests check
the graphs torchair builds, and test_generate.py runs the same stream through attnres_ge's backend bit for bit."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import capture, npu_compile
from torchair_standin import CaptureOnlyError

from attnres_ge import BlockAttnRes, ResidualStream
from attnres_ge.op_proto import FORWARD, PREPARE, UPDATE

T, H, LAYERS, BLOCK_SIZE = 5, 16, 4, 2
SEALS = -(-LAYERS // BLOCK_SIZE)
READS_AFTER_A_SEAL = 2 * LAYERS  # two per layer and the final one, but the first (nothing sealed yet)


def make_mixers():
    generator = torch.Generator().manual_seed(0)
    mixers = [BlockAttnRes(H) for _ in range(2 * LAYERS + 1)]  # attn, mlp per layer, then the final read
    with torch.no_grad():
        for mixer in mixers:
            mixer.proj_weight.copy_(torch.randn(1, H, generator=generator) / H**0.5)
    return mixers


def stream_forward(mixers, two_phase):
    """A K3 stack on the stream, tanh standing in for the sublayers."""

    def forward(embeddings):
        stream = ResidualStream(embeddings, max_blocks=SEALS, two_phase=two_phase)
        for layer in range(LAYERS):
            h = stream.read(mixers[2 * layer])
            if layer % BLOCK_SIZE == 0:
                end = min(layer + BLOCK_SIZE, LAYERS)
                stream.seal(readers=mixers[2 * layer + 1: 2 * end + 1])
            stream.accumulate(torch.tanh(h))
            h = stream.read(mixers[2 * layer + 1])
            stream.accumulate(torch.tanh(h))
        return stream.read(mixers[-1])

    return forward


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("two_phase", [None, False], ids=["two-phase", "per-layer"])
def test_a_no_grad_forward_becomes_our_nodes_in_one_graph(two_phase, device):
    forward = stream_forward([mixer.to(device) for mixer in make_mixers()], two_phase)
    embeddings = torch.randn(T, H, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        captured = capture(lambda: npu_compile(forward)(embeddings))
    assert captured.error is None or isinstance(captured.error, CaptureOnlyError), captured.error
    [graph] = captured.graphs  # fullgraph: the whole forward, no break
    counts = {op_type: len(graph.ops_of_type(op_type)) for op_type in (PREPARE.op_type, UPDATE.op_type,
                                                                       FORWARD.op_type)}
    if two_phase is None:
        assert counts == {PREPARE.op_type: SEALS, UPDATE.op_type: READS_AFTER_A_SEAL, FORWARD.op_type: 0}
    else:
        assert counts == {PREPARE.op_type: 0, UPDATE.op_type: 0, FORWARD.op_type: READS_AFTER_A_SEAL}
