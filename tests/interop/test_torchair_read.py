"""The general read through the real torchair: CANN's case becomes Pack + BlockAttentionResiduals (+ RmsNorm for an
output norm) and, in training, BlockAttentionResidualsGrad + Split; never a BlockAttnResRead node, which CANN's GE
does not have; every other case is refused by name. Meta inputs, as on an NPU: only the graphs are checked (the
stand-in cannot run CANN's Pack or RmsNorm)."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import attr_values, capture, npu_compile, only_op

from attnres_ge import fused_attnres
from attnres_ge.ge_plugin.read_torchair import TorchairReadError
from attnres_ge.op_proto import BACKWARD, FORWARD

T, L, H = 5, 4, 8
EPS, OUTPUT_EPS = 1e-5, 1e-4


def inputs(queries=1, keyed=True, gain=False, requires_grad=False):
    """L views of one [T, L, H] tensor (the sources), a query [S, H], the weights; meta, as on an NPU."""
    stream = torch.empty(T, L, H, device="meta", requires_grad=requires_grad)
    tensors = [torch.empty(queries, H, device="meta"), torch.empty(H, device="meta") if keyed else None,
               torch.empty(H, device="meta") if gain else None]
    return stream, *[t if t is None else t.requires_grad_(requires_grad) for t in tensors]


def read(stream, query, key, gain, normalize_values=False):
    return fused_attnres(query, list(stream.unbind(1)), key, gain, rms_eps=EPS, output_rms_eps=OUTPUT_EPS,
                         normalize_values=normalize_values)


def graphs_of(step):
    """The graphs torchair loads while `step()` runs, none holding a read node."""
    captured = capture(step)
    assert all("BlockAttnRes" + "Read" not in op_type for g in captured.graphs for op_type in g.op_types()), \
        "a read node reached torchair's graph, which CANN's GE could not load"
    return captured.graphs


def test_cann_case_is_pack_and_block_attention_residuals():
    [graph] = graphs_of(lambda: npu_compile(read)(*inputs()))
    op = only_op(graph, FORWARD.op_type)
    pack = only_op(graph, "Pack")
    assert len(pack.input) == L - 1 and attr_values(pack)["axis"] == 1 and attr_values(pack)["N"] == L - 1
    assert op.input[1] == f"{pack.name}:0"  # block_res: the first L-1 sources stacked; partial_block the last
    assert attr_values(op)["norm_eps"] == pytest.approx(EPS) and attr_values(op)["need_backward"] is False
    assert "RmsNorm" not in graph.op_types()


def test_output_norm_is_cann_rms_norm_after_the_read():
    [graph] = graphs_of(lambda: npu_compile(read)(*inputs(gain=True)))
    norm = only_op(graph, "RmsNorm")
    assert norm.input[0] == f"{only_op(graph, FORWARD.op_type).name}:0"
    assert attr_values(norm)["epsilon"] == pytest.approx(OUTPUT_EPS)


def test_training_step_is_block_attention_residuals_grad():
    stream, query, key, _ = inputs(requires_grad=True)
    forward, backward = graphs_of(lambda: npu_compile(read)(stream, query, key, None).sum().backward())
    assert attr_values(only_op(forward, FORWARD.op_type))["need_backward"] is True
    grad = only_op(backward, BACKWARD.op_type)
    ops = {op.name: op for op in backward.graph.op}
    block_res = ops[grad.input[1].rpartition(":")[0]]
    assert block_res.type == "Pack" and attr_values(block_res)["N"] == L - 1
    split = only_op(backward, "Split")
    assert split.input[1] == f"{grad.name}:1" and attr_values(split)["num_split"] == L - 1  # grad_block_res


@pytest.mark.parametrize(("case", "reason"), [
    pytest.param(dict(queries=3), "3 queries", id="several-queries"),
    pytest.param(dict(keyed=False), "no key-norm weight", id="no-key-weight"),
    pytest.param(dict(normalize_values=True), "normalize_values=True", id="normalised-values"),
])
def test_other_cases_are_refused_by_name(case, reason):
    normalize = case.pop("normalize_values", False)
    with pytest.raises(Exception, match=f"BlockAttnResRead under torchair.*this one has {reason}") as raised:
        capture(lambda: npu_compile(read)(*inputs(**case), normalize))
    assert TorchairReadError.__name__ in str(raised.value)  # torch.compile wraps it, naming its type
