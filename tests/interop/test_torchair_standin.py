"""The stand-in's own contract: what it answers torchair, and what it refuses to run."""

from __future__ import annotations

import pytest
import torch
import torchair_standin
from interop_helpers import compile_and_capture, make_inputs

from attnres_ge.op_proto import BACKWARD, FORWARD


def test_registered_ir_def_comes_from_our_prototypes():
    assert torchair_standin.get_registered_ir_def(FORWARD.op_type) == (
        "SUCCESS",
        [("partial_block", "required"), ("block_res", "required"), ("proj_weight", "required"),
         ("norm_weight", "required")],
        [("hidden_states", "required"), ("inv_norm", "required"), ("probs", "required")],
        [("valid_block_num", "VT_INT"), ("norm_eps", "VT_FLOAT"), ("need_backward", "VT_BOOL")],
    )
    status, inputs, outputs, attrs = torchair_standin.get_registered_ir_def(BACKWARD.op_type)
    assert (status, [name for name, _ in inputs]) == ("SUCCESS", BACKWARD.input_names())
    assert attrs == [("valid_block_num", "VT_INT")]


def test_unknown_op_type_is_not_registered():
    assert torchair_standin.get_registered_ir_def("MatMul") == ("ERROR", [], [], [])


def test_load_records_what_torchair_passed():
    graph = compile_and_capture(lambda *a: torch.ops.attnres.block_attention_residuals(*a)[0],
                                *make_inputs(3, 2, 4, device="meta")).graphs[0]
    assert graph.model_def_bytes and graph.executor_type == 0 and graph.compiled == 1 and graph.runs == 1
    assert graph.options["ge.inputHintShape"] == "0:[3, 4];1:[3, 2, 4];2:[1, 4];3:[4]"
    assert graph.input_placements == [1, 1, 1, 1] and graph.output_dtypes == [0]  # NPU; ge::DT_FLOAT
    assert graph.hint_input_shapes == [[3, 4], [3, 2, 4], [1, 4], [4]] and graph.hint_output_shapes == [[3, 4]]


def test_graph_with_other_ops_is_only_captured():
    def fn(*inputs):
        return torch.ops.attnres.block_attention_residuals(*inputs)[0] * 2

    result = compile_and_capture(fn, *make_inputs(3, 2, 4))
    assert {FORWARD.op_type, "Mul", "Cast"} <= set(result.graphs[0].op_types())
    with pytest.raises(torchair_standin.CaptureOnlyError) as caught:
        result.value()
    assert str(caught.value).splitlines()[0] == (  # torchair appends its own trace lines
        f"torchair stand-in only captures graph {result.graphs[0].name!r}: it holds ['Cast', 'Const', 'Mul'], "
        "and only graphs of Data, BlockAttentionResiduals, BlockAttentionResidualsGrad, BlockAttnResPrepare, "
        "BlockAttnResUpdate and NetOutput can run here"
    )


def test_install_after_torchair_is_refused():
    with pytest.raises(RuntimeError, match=r"^torchair stand-in: install\(\) must run before torchair is imported$"):
        torchair_standin.install()
