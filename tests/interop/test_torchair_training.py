"""A training step through the real torchair: forward and backward graphs, static and with a dynamic token count."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import (
    TORCH_TO_PROTO_DTYPE,
    assert_bitwise_equal,
    assert_node_matches_prototype,
    attr_values,
    capture,
    make_inputs,
    npu_compile,
    only_op,
    output_dtypes,
)

from attnres_ge import block_attention_residuals
from attnres_ge.op_proto import BACKWARD, FORWARD

N, H = 3, 8
STATIC_T = 5
DYNAMIC_TS = (5, 7, 11)
INPUT_NAMES = ("partial_block", "block_res", "proj_weight", "norm_weight")


def training_step(fn, tokens, device="cpu", mark_dynamic=False):
    """hidden_states = fn(...); hidden_states.backward(g): returns {name: tensor} of the output and the grads."""
    inputs = make_inputs(tokens, N, H, device=device, requires_grad=True, seed=tokens)
    if mark_dynamic:
        for tensor in inputs[:2]:
            torch._dynamo.mark_dynamic(tensor, 0)
    hidden = fn(*inputs)
    hidden.backward(torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens)).to(device))
    return {"hidden_states": hidden.detach(), **{f"grad_{n}": t.grad for n, t in zip(INPUT_NAMES, inputs, strict=True)}}


def assert_same_as_eager(results, tokens):
    for name, expected in training_step(block_attention_residuals, tokens).items():
        assert_bitwise_equal(f"T={tokens} {name}", results[name], expected)


def compiled_steps(device, token_counts, mark_dynamic):
    """One compiled function, a training step per token count: (Capture of {T: results}, dynamo's stats)."""
    torch._dynamo.utils.counters.clear()

    def steps():
        compiled = npu_compile(block_attention_residuals)
        return {tokens: training_step(compiled, tokens, device, mark_dynamic) for tokens in token_counts}

    return capture(steps), dict(torch._dynamo.utils.counters["stats"])


@pytest.fixture(scope="module")
def static_step():
    """Meta inputs, as on an NPU: the graphs do not depend on the local GE running them."""
    return compiled_steps("meta", [STATIC_T], mark_dynamic=False)[0]


@pytest.fixture(scope="module")
def dynamic_steps():
    """Three token counts, T marked dynamic, meta inputs."""
    return compiled_steps("meta", DYNAMIC_TS, mark_dynamic=True)


# The forward's statistics are differentiable (second-order gradients), so AOTAutograd saves them through
# aten.detach, which torchair emits as GE Identity ops (GE's graph passes remove them).
SAVED_STATISTICS = ["Identity"] * 2


def without_identities(op_types):
    return [op_type for op_type in op_types if op_type != "Identity"]


def forward_and_backward(graphs):
    assert [without_identities(g.op_types())[-2:] for g in graphs] == [
        [FORWARD.op_type, "NetOutput"], [BACKWARD.op_type, "NetOutput"]]
    return graphs


def test_training_step_gives_a_forward_and_a_backward_graph(static_step):
    forward, backward = forward_and_backward(static_step.graphs)
    assert forward.op_types() == ["Data"] * 4 + [FORWARD.op_type, *SAVED_STATISTICS, "NetOutput"]
    assert backward.op_types() == ["Data"] * 7 + [*SAVED_STATISTICS, BACKWARD.op_type, "NetOutput"]


def test_forward_node_saves_statistics_for_backward(static_step):
    forward, _ = static_step.graphs
    op = only_op(forward, FORWARD.op_type)
    assert_node_matches_prototype(op, FORWARD)
    assert attr_values(op)["need_backward"] is True
    assert forward.hint_output_shapes == [[STATIC_T, H], [STATIC_T, N + 1], [STATIC_T, N + 1]]


def test_backward_node_matches_prototype(static_step):
    _, backward = static_step.graphs
    op = only_op(backward, BACKWARD.op_type)
    assert_node_matches_prototype(op, BACKWARD)
    assert attr_values(op) == {"valid_block_num": 0}
    assert output_dtypes(op) == dict.fromkeys(BACKWARD.output_names(), TORCH_TO_PROTO_DTYPE[torch.float32])
    assert backward.hint_output_shapes == [[STATIC_T, H], [STATIC_T, N, H], [1, H], [H]]


def test_training_step_runs_on_local_ge_bit_for_bit():
    result, _ = compiled_steps("cpu", [STATIC_T], mark_dynamic=False)
    assert [(g.compiled, g.runs) for g in result.graphs] == [(1, 1), (1, 1)]
    assert_same_as_eager(result.value()[STATIC_T], STATIC_T)


def test_dynamic_token_count_compiles_once(dynamic_steps):
    result, stats = dynamic_steps
    assert stats.get("unique_graphs") == 1, stats
    forward_and_backward(result.graphs)  # exactly two graphs for three token counts
    assert [(g.compiled, g.runs) for g in result.graphs] == [(1, len(DYNAMIC_TS))] * 2


def test_dynamic_token_count_is_minus_one_in_the_graph(dynamic_steps):
    forward, backward = dynamic_steps[0].graphs
    tokens_first = [[-1, H], [-1, N, H], [1, H], [H]]
    assert forward.hint_input_shapes == tokens_first
    assert [list(d.shape.dim) for d in only_op(forward, FORWARD.op_type).input_desc] == tokens_first
    grad_inputs = [list(d.shape.dim) for d in only_op(backward, BACKWARD.op_type).input_desc]
    assert grad_inputs[:5] == tokens_first + [[-1, H]]
    # inv_norm and probs arrive through the Identity ops, whose output descs torchair leaves to GE's InferShape.
    statistics = [list(op.input_desc[0].shape.dim) for op in backward.ops_of_type("Identity")]
    assert statistics == [[-1, N + 1], [-1, N + 1]]
    assert forward.options["ge.inputHintShape"] == f"0:[5, {H}];1:[5, {N}, {H}];2:[1, {H}];3:[{H}]"


@pytest.mark.parametrize("op_type", [FORWARD.op_type, BACKWARD.op_type])
def test_dynamic_node_carries_torchairs_symbolic_shapes(dynamic_steps, op_type):
    """torchair's `_inference_rule`: the output shapes in terms of the token-count symbol."""
    graph = next(g for g in dynamic_steps[0].graphs if op_type in g.op_types())
    rule = json.loads(only_op(graph, op_type).attr["_inference_rule"].s)
    tokens = rule["shape"]["inputs"][0][0]
    assert tokens.startswith("s") and rule["shape"]["inputs"][0] == [tokens, str(H)]
    expected = {
        FORWARD.op_type: [[tokens, str(H)], [tokens, str(N + 1)], [tokens, str(N + 1)]],
        BACKWARD.op_type: [[tokens, str(H)], [tokens, str(N), str(H)], ["1", str(H)], [str(H)]],
    }[op_type]
    assert rule["shape"]["outputs"] == expected
    assert rule["dtype"] == [0] * len(expected)  # ge::DataType DT_FLOAT


def test_dynamic_token_counts_run_on_local_ge_bit_for_bit():
    result, stats = compiled_steps("cpu", DYNAMIC_TS, mark_dynamic=True)
    for tokens, results in result.value().items():
        assert_same_as_eager(results, tokens)
    assert stats.get("unique_graphs") == 1, stats
    assert [(g.compiled, g.runs) for g in result.graphs] == [(1, len(DYNAMIC_TS))] * 2
