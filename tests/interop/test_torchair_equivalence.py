"""Our converters vs torchair's own ways of emitting a custom op, with the prototype from our registry.

torchair offers two ways that read the prototype through `get_registered_ir_def`, i.e. from
attnres_ge.op_proto here: the positional `torchair.ge.custom_op(op_type, *inputs, *attrs)` and
the converter it generates itself for a custom op that has none. Both must yield the very node
our hand-written converters emit. The automatic converter derives the GE type from the op name
(`block_attention_residuals_grad` -> BlockAttentionResidualsGrad), so it is fed test-only torch
ops of the same schemas in namespace `attnres_auto`; namespace `attnres_positional` holds the
ones converted with the positional form.
"""

from __future__ import annotations

import pytest
import torch
import torchair
import torchair_standin
from interop_helpers import compile_and_capture, make_inputs, node_signature, only_op
from torchair._ge_concrete_graph.fx2ge_converter import _get_converter

from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS, BLOCK_ATTENTION_RESIDUALS_GRAD
from attnres_ge.op_proto import BACKWARD, FORWARD

FORWARD_SCHEMA = BLOCK_ATTENTION_RESIDUALS.schema()
BACKWARD_SCHEMA = BLOCK_ATTENTION_RESIDUALS_GRAD.schema()

T, N, H = 6, 2, 16
NORM_EPS = 1e-5


def define_alias(namespace: str, op_name: str, schema: str, target):
    """torch op `<namespace>::<op_name>` with `schema`, computing (eager and fake) through `target`."""
    op = torch.library.custom_op(f"{namespace}::{op_name}", lambda *a, **k: target(*a, **k), mutates_args=(),
                                 schema=schema)
    op.register_fake(lambda *a, **k: target(*a, **k))
    return getattr(getattr(torch.ops, namespace), op_name).default


ATTNRES = torch.ops.attnres
AUTO_FORWARD = define_alias("attnres_auto", "block_attention_residuals", FORWARD_SCHEMA,
                            ATTNRES.block_attention_residuals)
AUTO_BACKWARD = define_alias("attnres_auto", "block_attention_residuals_grad", BACKWARD_SCHEMA,
                             ATTNRES.block_attention_residuals_backward)
POSITIONAL_FORWARD = define_alias("attnres_positional", "block_attention_residuals", FORWARD_SCHEMA,
                                  ATTNRES.block_attention_residuals)
POSITIONAL_BACKWARD = define_alias("attnres_positional", "block_attention_residuals_backward", BACKWARD_SCHEMA,
                                   ATTNRES.block_attention_residuals_backward)


@torchair.register_fx_node_ge_converter(POSITIONAL_FORWARD)
def convert_positional_forward(partial_block, block_res, proj_weight, norm_weight, valid_block_num=-1,
                               norm_eps=1e-6, need_backward=False, meta_outputs=None):
    return torchair.ge.custom_op(FORWARD.op_type, partial_block, block_res, proj_weight, norm_weight,
                                 valid_block_num, norm_eps, need_backward)


@torchair.register_fx_node_ge_converter(POSITIONAL_BACKWARD)
def convert_positional_backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm,
                                probs, *, valid_block_num=0, meta_outputs=None):
    return torchair.ge.custom_op(BACKWARD.op_type, partial_block, block_res, proj_weight, norm_weight,
                                 grad_hidden_states, inv_norm, probs, valid_block_num)


FORWARD_OPS = {"ours": ATTNRES.block_attention_residuals.default, "positional": POSITIONAL_FORWARD,
               "automatic": AUTO_FORWARD}
BACKWARD_OPS = {"ours": ATTNRES.block_attention_residuals_backward.default, "positional": POSITIONAL_BACKWARD,
                "automatic": AUTO_BACKWARD}


def forward_inputs():
    return make_inputs(T, N, H, device="meta")


def backward_inputs():
    stats = [torch.empty(T, N + 1, device="meta") for _ in range(2)]  # inv_norm, probs: float32
    return [*forward_inputs(), torch.empty(T, H, device="meta"), *stats]


def captured_node(op, inputs, op_type, **attrs):
    graphs = compile_and_capture(lambda *args: op(*args, **attrs), *inputs).graphs
    assert len(graphs) == 1, [g.name for g in graphs]
    return graphs[0], only_op(graphs[0], op_type)


@pytest.fixture(scope="module")
def forward_nodes():
    """way -> (graph, node), the forward called with every attribute given."""
    return {way: captured_node(op, [*forward_inputs(), -1, NORM_EPS, True], FORWARD.op_type)
            for way, op in FORWARD_OPS.items()}


@pytest.fixture(scope="module")
def backward_nodes():
    """way -> (graph, node), the backward called with its attribute left at the default."""
    return {way: captured_node(op, backward_inputs(), BACKWARD.op_type) for way, op in BACKWARD_OPS.items()}


def test_no_converter_is_registered_for_the_automatic_ops():
    assert _get_converter(AUTO_FORWARD) is None and _get_converter(AUTO_BACKWARD) is None


@pytest.mark.parametrize("way", ["positional", "automatic"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_node_equals_the_one_from_our_converter(request, direction, way):
    nodes = request.getfixturevalue(f"{direction}_nodes")
    (ours_graph, ours), (graph, node) = nodes["ours"], nodes[way]
    assert node_signature(node) == node_signature(ours)
    assert graph.op_types() == ours_graph.op_types()


def test_automatic_converter_was_generated_from_our_prototypes(forward_nodes, backward_nodes):
    for op in (AUTO_FORWARD, AUTO_BACKWARD):
        assert getattr(op, "_ge_converter", None) is not None, f"{op}: torchair did not generate a converter"
    assert {FORWARD.op_type, BACKWARD.op_type} <= set(torchair_standin.IR_QUERIES)


def test_positional_form_with_the_wrong_argument_count_is_refused():
    """The positional form counts against our prototype: 4 inputs + 3 attributes."""

    def convert_short(partial_block, block_res, proj_weight, norm_weight, *attrs, meta_outputs=None):
        return torchair.ge.custom_op(FORWARD.op_type, partial_block, block_res, proj_weight, norm_weight)

    short = define_alias("attnres_short", "block_attention_residuals", FORWARD_SCHEMA,
                         ATTNRES.block_attention_residuals)
    torchair.register_fx_node_ge_converter(short)(convert_short)
    with pytest.raises(Exception, match="The AscendIR BlockAttentionResiduals expected 7 args but got 4. "):
        compile_and_capture(short, *forward_inputs())


def test_unknown_op_type_is_refused_with_torchairs_message():
    unknown = define_alias("attnres_auto", "no_such_attention", FORWARD_SCHEMA, ATTNRES.block_attention_residuals)
    with pytest.raises(Exception, match="No AscendIR NoSuchAttention was found to be registered"):
        compile_and_capture(unknown, *forward_inputs())
    assert torchair_standin.get_registered_ir_def("NoSuchAttention") == ("ERROR", [], [], [])
