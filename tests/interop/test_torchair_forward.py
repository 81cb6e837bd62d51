"""Forward op through the real torchair: the BlockAttentionResiduals node our converter emits, and its run."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import (
    DTYPE_IDS,
    TORCH_TO_PROTO_DTYPE,
    assert_bitwise_equal,
    assert_node_matches_prototype,
    attr_values,
    compile_and_capture,
    make_inputs,
    only_op,
    output_dtypes,
)
from torchair._ge_concrete_graph.fx2ge_converter import _get_converter

from attnres_ge.op_proto import FORWARD

T, N, H = 5, 3, 8
NORM_EPS = 1e-5
HOST, DEVICE = 0, 1  # torchair's input placements
DTYPES = [pytest.param(dtype, id=name) for dtype, name in DTYPE_IDS.items()]


def forward(partial_block, block_res, proj_weight, norm_weight):
    return torch.ops.attnres.block_attention_residuals(
        partial_block, block_res, proj_weight, norm_weight, -1, NORM_EPS, True
    )


@pytest.fixture(scope="module", params=["meta", "cpu"])
def device(request):
    return request.param


@pytest.fixture(scope="module", params=DTYPES)
def captured(request, device):
    """(graph torchair loaded, its node, inputs, Capture) for one device and dtype."""
    inputs = make_inputs(T, N, H, request.param, device)
    capture = compile_and_capture(forward, *inputs)
    assert len(capture.graphs) == 1, [g.name for g in capture.graphs]
    graph = capture.graphs[0]
    return graph, only_op(graph, FORWARD.op_type), inputs, capture


def test_our_converter_is_the_one_torchair_calls():
    converter = _get_converter(torch.ops.attnres.block_attention_residuals.default)
    assert converter is not None and converter.__module__.startswith("attnres_ge.ge_plugin")


def test_graph_holds_data_our_node_and_net_output(captured):
    graph, *_ = captured
    assert graph.op_types() == ["Data"] * 4 + [FORWARD.op_type, "NetOutput"]


def test_node_matches_prototype(captured):
    _, op, _, _ = captured
    assert_node_matches_prototype(op, FORWARD)
    assert list(op.input) == [f"arg{i}_1:0" for i in range(4)]  # the four Data nodes, in prototype order
    assert attr_values(op) == {"valid_block_num": -1, "norm_eps": pytest.approx(NORM_EPS), "need_backward": True}


def test_dtypes_follow_spec(captured):
    """hidden_states in the dtype of partial_block; inv_norm and probs float32 (docs/contract.md)."""
    graph, op, inputs, _ = captured
    dtype = inputs[0].dtype
    assert [desc.dtype for desc in op.input_desc] == [TORCH_TO_PROTO_DTYPE[dtype]] * 4
    float32 = TORCH_TO_PROTO_DTYPE[torch.float32]
    assert output_dtypes(op) == {"hidden_states": TORCH_TO_PROTO_DTYPE[dtype], "inv_norm": float32, "probs": float32}
    assert graph.hint_output_shapes == [[T, H], [T, N + 1], [T, N + 1]]


def test_placements_follow_the_input_device(captured, device):
    graph, op, _, _ = captured
    assert graph.input_placements == [DEVICE if device == "meta" else HOST] * 4
    assert graph.executor_type == 0  # CPU executor: torch_npu is not imported
    assert {desc.device_type for desc in op.input_desc} == {"NPU" if device == "meta" else "CPU"}


def test_graph_runs_on_local_ge_bit_for_bit(captured, device):
    graph, _, inputs, capture = captured
    outputs = capture.value()
    assert graph.compiled == 1 and graph.runs == 1
    expected = forward(*inputs)  # eager; on meta inputs the fake kernel
    for name, actual, wanted in zip(FORWARD.output_names(), outputs, expected, strict=True):
        if device == "meta":  # no values: the stand-in answers meta tensors of the graph's output descs
            assert (actual.device.type, actual.dtype, actual.shape) == ("meta", wanted.dtype, wanted.shape), name
        else:
            assert_bitwise_equal(name, actual, wanted)
