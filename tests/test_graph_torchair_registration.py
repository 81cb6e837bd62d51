"""Converter registration with torchair (a fake torchair module here) and for CANN's same-schema ops."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch._dynamo

import attnres_ge
from attnres_ge.ge_plugin import converters, ge_attr

ATTNRES_FORWARD = torch.ops.attnres.block_attention_residuals.default
ATTNRES_BACKWARD = torch.ops.attnres.block_attention_residuals_backward.default


class FakeTorchairGe(types.SimpleNamespace):
    """Stands in for `torchair.ge`: records each custom_op call and returns one marker per output."""

    def __init__(self):
        super().__init__(attr=ge_attr, calls=[])

    def custom_op(self, op_type, inputs, outputs, attrs):
        self.calls.append({"op_type": op_type, "inputs": inputs, "outputs": outputs, "attrs": attrs})
        return tuple(f"{op_type}:{i}" for i in range(len(outputs)))


@pytest.fixture
def fake_torchair(monkeypatch):
    """A module named torchair in sys.modules whose register_fx_node_ge_converter records what it got."""
    module = types.ModuleType("torchair")
    module.registered = {}
    module.ge = FakeTorchairGe()

    def register_fx_node_ge_converter(op):
        def decorator(converter):
            module.registered[op] = converter
            return converter

        return decorator

    module.register_fx_node_ge_converter = register_fx_node_ge_converter
    monkeypatch.setitem(sys.modules, "torchair", module)
    return module


def test_converters_register_with_torchair_when_it_imports(fake_torchair):
    newly = converters.register_torchair_converters()
    assert {ATTNRES_FORWARD, ATTNRES_BACKWARD} <= set(newly)
    assert fake_torchair.registered[ATTNRES_FORWARD].__name__ == "convert_block_attention_residuals"
    assert fake_torchair.registered[ATTNRES_BACKWARD].__name__ == "convert_block_attention_residuals_backward"
    assert converters.register_torchair_converters() == [], "registering twice must not duplicate"


def test_registered_forward_converter_emits_through_torchair_ge(fake_torchair):
    converters.register_torchair_converters()
    outputs = fake_torchair.registered[ATTNRES_FORWARD]("p", "b", "w", "n", -1, 1e-5, True, meta_outputs=None)
    [call] = fake_torchair.ge.calls
    assert call["op_type"] == "BlockAttentionResiduals"
    assert list(call["inputs"].items()) == [("partial_block", "p"), ("block_res", "b"), ("proj_weight", "w"),
                                            ("norm_weight", "n")]
    assert call["outputs"] == ["hidden_states", "inv_norm", "probs"]
    assert call["attrs"] == {"valid_block_num": ge_attr.Int(-1), "norm_eps": ge_attr.Float(1e-5),
                             "need_backward": ge_attr.Bool(True)}
    assert outputs == ("BlockAttentionResiduals:0", "BlockAttentionResiduals:1", "BlockAttentionResiduals:2")


def test_registered_backward_converter_emits_through_torchair_ge(fake_torchair):
    converters.register_torchair_converters()
    tensors = ["p", "b", "w", "n", "g", "r", "s"]
    fake_torchair.registered[ATTNRES_BACKWARD](*tensors, meta_outputs=None)
    [call] = fake_torchair.ge.calls
    assert call["op_type"] == "BlockAttentionResidualsGrad"
    assert list(call["inputs"]) == ["partial_block", "block_res", "proj_weight", "norm_weight", "grad_hidden_states",
                                    "inv_norm", "probs"]
    assert list(call["inputs"].values()) == tensors
    assert call["attrs"] == {"valid_block_num": ge_attr.Int(0)}
    assert len(call["outputs"]) == 4


def test_without_torchair_nothing_is_registered(monkeypatch):
    monkeypatch.delitem(sys.modules, "torchair", raising=False)
    monkeypatch.setattr(converters.importlib.util, "find_spec", lambda name: None)
    assert converters.register_torchair_converters() == []


# CANN's eager-only torch ops, stood in for by ops of the same schemas in the same namespace.
CANN_FORWARD_SCHEMA = (
    "(Tensor partial_block, Tensor block_res, Tensor proj_weight, Tensor norm_weight, int validBlockNum=-1, "
    "float normEps=1e-06, bool needBackward=False) -> (Tensor, Tensor, Tensor)"
)


@pytest.fixture(scope="module")
def cann_forward_op():
    """torch.ops.cann_ops_transformer.block_attention_residuals, forwarding to the attnres op."""
    existing = converters._overload("cann_ops_transformer", "block_attention_residuals")
    if existing is not None:
        return existing

    @torch.library.custom_op("cann_ops_transformer::block_attention_residuals", mutates_args=(),
                             schema=CANN_FORWARD_SCHEMA)
    def cann_forward(partial_block, block_res, proj_weight, norm_weight, validBlockNum=-1, normEps=1e-6,  # noqa: N803
                     needBackward=False):
        outputs = ATTNRES_FORWARD(partial_block, block_res, proj_weight, norm_weight, validBlockNum, normEps,
                                  needBackward)
        return tuple(t.clone() for t in outputs)

    @cann_forward.register_fake
    def _(partial_block, block_res, proj_weight, norm_weight, validBlockNum=-1, normEps=1e-6,  # noqa: N803
          needBackward=False):
        return ATTNRES_FORWARD(partial_block, block_res, proj_weight, norm_weight, validBlockNum, normEps,
                               needBackward)

    return torch.ops.cann_ops_transformer.block_attention_residuals.default


def test_cann_ops_gain_converters_when_loaded(cann_forward_op, fake_torchair):
    assert cann_forward_op in converters.local_converters()
    converters.register_torchair_converters()
    fake_torchair.registered[cann_forward_op]("p", "b", "w", "n", validBlockNum=-1, normEps=1e-4,
                                              needBackward=True, meta_outputs=None)
    [call] = fake_torchair.ge.calls
    assert call["op_type"] == "BlockAttentionResiduals"
    assert set(call["attrs"]) == {"valid_block_num", "norm_eps", "need_backward"}  # prototype names, not CANN's


def test_cann_op_runs_in_graph_mode_bit_identical(cann_forward_op):
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=generator) for shape in ([5, 8], [5, 2, 8], [1, 8], [8])]

    def fn(p, b, w, n):
        return torch.ops.cann_ops_transformer.block_attention_residuals(p, b, w, n, -1, 1e-6, True)

    backend = attnres_ge.ge_backend()
    got = torch.compile(fn, backend=backend)(*tensors)
    want = fn(*tensors)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    [graph] = backend.graphs
    node = graph.op[-2]
    assert node.type == "BlockAttentionResiduals"
    assert node.attr["need_backward"].b is True and node.attr["valid_block_num"].i == -1


def test_two_phase_converters_register_and_emit_through_torchair_ge(fake_torchair):
    prepare_op = torch.ops.attnres.block_attn_res_prepare.default
    update_op = torch.ops.attnres.block_attn_res_update.default
    converters.register_torchair_converters()
    assert fake_torchair.registered[prepare_op].__name__ == "convert_block_attn_res_prepare"
    assert fake_torchair.registered[update_op].__name__ == "convert_block_attn_res_update"

    states = fake_torchair.registered[prepare_op]("b", "v", "q", eps=1e-5, meta_outputs=None)
    h = fake_torchair.registered[update_op]("p", "d", "q", "n", "m", "e", meta_outputs=None)
    prepare_call, update_call = fake_torchair.ge.calls
    assert prepare_call["op_type"] == "BlockAttnResPrepare"
    assert list(prepare_call["inputs"].items()) == [("block_res", "b"), ("valid_blocks", "v"), ("pseudo_query", "q")]
    assert prepare_call["outputs"] == ["numerator", "logit_max", "exp_sum"]
    assert prepare_call["attrs"] == {"eps": ge_attr.Float(1e-5)}
    assert states == ("BlockAttnResPrepare:0", "BlockAttnResPrepare:1", "BlockAttnResPrepare:2")
    assert update_call["op_type"] == "BlockAttnResUpdate"
    assert list(update_call["inputs"].items()) == [("partial_block", "p"), ("delta", "d"), ("pseudo_query", "q"),
                                                   ("numerator", "n"), ("logit_max", "m"), ("exp_sum", "e")]
    # partial_block is also the first output (the reference tensor); the converter returns h, as the torch op does
    assert update_call["outputs"] == ["partial_block", "h"]
    assert update_call["attrs"] == {"eps": ge_attr.Float(1e-6)}
    assert h == "BlockAttnResUpdate:1"
