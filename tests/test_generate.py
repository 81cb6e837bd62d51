"""examples/generate.py: decoding on KV caches equals a full forward, and the two-phase reads equal the per-layer
reads of the same model."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import attnres_ge
from attnres_ge.examples.generate import generate, main
from attnres_ge.examples.model import BlockAttnResLM, KVCache
from attnres_ge.stream import two_phase_ops_available


def model_and_prompt(two_phase, layers=3, layers_per_block=2):
    torch.manual_seed(0)
    model = BlockAttnResLM(layers=layers, layers_per_block=layers_per_block, two_phase=two_phase).eval()
    with torch.no_grad():  # sharper pseudo-queries than the model's init, so depth mixing matters
        for name, parameter in model.named_parameters():
            if name.endswith("proj_weight"):
                parameter.normal_(std=0.5)
    return model, torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("two_phase", [False, None], ids=["per-layer", "automatic"])
def test_decoding_on_the_caches_equals_a_full_forward(two_phase):
    model, prompt = model_and_prompt(two_phase)
    run = generate(model, prompt, new_tokens=4)
    sequence = torch.cat((prompt, run.tokens), dim=1)
    caches = [KVCache() for _ in model.layers]
    with torch.no_grad():
        full = model(sequence[:, :-1])  # every position at once, no cache
        stepped = [model(prompt, caches)[:, -1]]
        for position in range(prompt.shape[1], sequence.shape[1] - 1):
            stepped.append(model(sequence[:, position : position + 1], caches)[:, -1])
    torch.testing.assert_close(torch.stack(stepped, dim=1), full[:, prompt.shape[1] - 1 :], rtol=1e-4, atol=1e-5)
    assert torch.equal(full[:, prompt.shape[1] - 1 :].argmax(-1), run.tokens)


@pytest.mark.skipif(not two_phase_ops_available(), reason="the two-phase torch ops are not built")
@pytest.mark.parametrize(("layers", "layers_per_block"), [(3, 2), (4, 2), (4, 1)])
def test_two_phase_generation_equals_per_layer_generation(layers, layers_per_block):
    runs = {}
    for two_phase in (True, False):
        model, prompt = model_and_prompt(two_phase, layers, layers_per_block)
        caches = [KVCache() for _ in model.layers]
        with torch.no_grad():
            runs[two_phase] = (model(prompt, caches), model(prompt[:, :1], caches))  # prefill, one decode step
    for two_phase_logits, per_layer_logits in zip(runs[True], runs[False], strict=True):
        torch.testing.assert_close(two_phase_logits, per_layer_logits, rtol=1e-4, atol=1e-5)


def test_the_example_prints_tokens_and_time_per_token(capsys):
    run = main(["--new-tokens", "3"])
    assert run.tokens.shape == (2, 3) and len(run.decode_seconds) == 2
    printed = capsys.readouterr().out
    assert "sequence 0: prompt" in printed and "ms per token" in printed


@pytest.mark.slow
@pytest.mark.parametrize("two_phase", [pytest.param(None, marks=pytest.mark.skipif(
    not two_phase_ops_available(), reason="the two-phase torch ops are not built")), False],
    ids=["two-phase", "per-layer"])
def test_generation_in_graph_mode_equals_eager_bit_for_bit(tmp_path, two_phase):
    """Under attnres_ge's backend, in one graph per call, the stream's two-phase reads are BlockAttnResPrepare/
    BlockAttnResUpdateNorm nodes (the example model fuses its RMSNorms into the reads); its per-layer reads are
    general reads, BlockAttnResRead nodes."""
    torch._dynamo.reset()
    model, prompt = model_and_prompt(two_phase)
    backend = attnres_ge.ge_backend(dump_path=str(tmp_path))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    eager_caches, graph_caches = [KVCache() for _ in model.layers], [KVCache() for _ in model.layers]
    with torch.no_grad():
        for tokens in (prompt, prompt[:, :1], prompt[:, 1:2]):  # the prefill, then two decode steps
            assert torch.equal(compiled(tokens, graph_caches), model(tokens, eager_caches))
    node_types = "".join(path.read_text() for path in tmp_path.glob("*.pbtxt"))
    two_phase_nodes = 'type: "BlockAttnResPrepare"' in node_types and 'type: "BlockAttnResUpdateNorm"' in node_types
    assert two_phase_nodes == (two_phase is None)
    left = [node for graph in backend.fx_graphs for node in graph.graph.nodes
            if node.target is torch.ops.attnres.block_attn_res_read.default]
    general_reads = sum(graph.op[-2].type == "BlockAttnResRead" for graph in backend.graphs)
    # Per graph (one per call) every read became a GE node, none is left a torch call: two per layer and the final
    # one (the first one for its output norm), or on the two-phase path the first alone (nothing sealed yet).
    per_call = 2 * len(model.layers) + 1 if two_phase is False else 1
    assert not left and backend.fx_graphs and general_reads == per_call * len(backend.fx_graphs)
