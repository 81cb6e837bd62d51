"""The general read in graph mode on the local GE: BlockAttnResRead / BlockAttnResReadGrad nodes with a dynamic
input (sources0, sources1, ...) and a dynamic output (grad_sources0, ...), bit for bit equal to eager; the builder
and the local GE checking how a dynamic input or output is spelled."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import attnres_ge
from attnres_ge import fused_attnres
from attnres_ge.ge_plugin import ge, ge_attr, ge_ir
from attnres_ge.ge_plugin.converters import make_converter
from attnres_ge.ge_plugin.local_ge import compile_graph
from attnres_ge.ge_plugin.ops import READ_GRAD_OP as READ_GRAD
from attnres_ge.ge_plugin.ops import READ_OP as READ
from attnres_ge.op_proto import AttnResInputError

T, L, H = 5, 3, 8
GE_DTYPE = {torch.float32: ge_ir.DT_FLOAT, torch.bfloat16: ge_ir.DT_BF16}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# The read's cases: (queries, key-norm weight, output-norm weight rows or None, normalize_values, scale).
CASES = [
    pytest.param(1, True, None, False, 1.0, id="cann-case"),
    pytest.param(1, True, 1, False, 1.0, id="fla-output-norm"),
    pytest.param(3, False, 3, True, H**-0.5, id="inkling2-three-queries"),
]


def make_inputs(queries, keyed, gain_rows, dtype=torch.float32, tokens=T, seed=0):
    """(stream [T, L, H] whose unbind(1) is the list of sources, query [S, H], key weight, output weight)."""
    generator = torch.Generator().manual_seed(seed)
    stream = torch.randn(tokens, L, H, generator=generator).to(dtype)
    query = (0.5 * torch.randn(queries, H, generator=generator)).to(dtype)
    key = (torch.rand(H, generator=generator) + 0.5).to(dtype) if keyed else None
    gain = None if gain_rows is None else (torch.rand(gain_rows, H, generator=generator) + 0.5).to(dtype)
    return stream, query, key, gain


def read_views(stream, query, key, gain, normalize_values=False, scale=1.0):
    """The read of views of one tensor (its L slices along dim 1, each with row stride L*H), weights too."""
    return fused_attnres(query, list(stream.unbind(1)), key, gain, scale=scale, return_weights=True,
                         normalize_values=normalize_values)


def descs(op_descs):
    return [(d.name, d.dtype, list(d.shape.dim)) for d in op_descs]


def assert_bit_identical(got, want, what):
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a is not None and b is not None, f"{what}[{index}]: a gradient is missing"
        assert a.dtype == b.dtype and torch.equal(a, b), f"{what}[{index}] differs between graph and eager"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("queries", "keyed", "gain_rows", "normalize", "scale"), CASES)
def test_forward_of_a_list_of_views_is_bit_identical(queries, keyed, gain_rows, normalize, scale, dtype):
    inputs = make_inputs(queries, keyed, gain_rows, dtype)
    backend = attnres_ge.ge_backend()
    with torch.no_grad():
        want = read_views(*inputs, normalize, scale)
        got = torch.compile(read_views, backend=backend, fullgraph=True)(*inputs, normalize, scale)
    assert_bit_identical(got, want, "output and weights")
    [graph] = backend.graphs
    op = graph.op[-2]
    assert [o.type for o in graph.op] == ["Data"] * (L + 1 + keyed + (gain_rows is not None)) + [
        READ.op_type, "NetOutput"]
    dt, f32 = GE_DTYPE[dtype], ge_ir.DT_FLOAT
    assert descs(op.input_desc)[:L + 1] == [*[(f"sources{i}", dt, [T, H]) for i in range(L)],
                                            ("query", dt, [queries, H])]
    assert list(op.input)[:L] == [f"{o.name}:0" for o in graph.op[:L]]  # one Data per view
    assert descs(op.output_desc)[:3] == [("hidden_states", dt, [queries, T, H]), ("inv_norm", f32, [T, L]),
                                         ("probs", f32, [queries, T, L])]


def training_step(fn, stream, query, key, gain, normalize, scale):
    """Output and the gradient of every input after one backward of a sum of squares."""
    leaves = [t for t in (stream, query, key, gain) if t is not None]
    for leaf in leaves:
        leaf.grad = None
    out = fn(stream, query, key, gain, normalize, scale)
    (out.float() ** 2).sum().backward()
    return [out.detach(), *(leaf.grad for leaf in leaves)]


def read_output(stream, query, key, gain, normalize, scale):
    return read_views(stream, query, key, gain, normalize, scale)[0]


@pytest.mark.parametrize(("queries", "keyed", "gain_rows", "normalize", "scale"), CASES)
def test_training_step_through_aot_autograd_is_bit_identical(queries, keyed, gain_rows, normalize, scale):
    inputs = [t if t is None else t.requires_grad_() for t in make_inputs(queries, keyed, gain_rows)]
    want = training_step(read_output, *inputs, normalize, scale)
    backend = attnres_ge.ge_backend()
    got = training_step(torch.compile(read_output, backend=backend), *inputs, normalize, scale)
    assert_bit_identical(got, want, "output and gradients")
    forward, backward = backend.graphs
    assert (forward.op[-2].type, backward.op[-2].type) == (READ.op_type, READ_GRAD.op_type)
    assert forward.op[-2].attr["save_statistics"].b is True
    op = backward.op[-2]
    assert [d.name for d in op.input_desc][1:L + 1] == [f"sources{i}" for i in range(L)]
    assert descs(op.output_desc)[:L + 1] == [*[(f"grad_sources{i}", ge_ir.DT_FLOAT, [T, H]) for i in range(L)],
                                             ("grad_query", ge_ir.DT_FLOAT, [queries, H])]
    assert list(backward.op[-1].input)[:L] == [f"{op.name}:{i}" for i in range(L)]


def test_one_tensor_twice_in_the_list_is_one_data_read_twice():
    def read_twice(x, query, key):
        return torch.ops.attnres.block_attn_res_read([x, x * 2, x], query, key, save_statistics=True)[0]

    x, query, key, _ = make_inputs(1, True, None)
    x, query, key = x[:, 0].clone().requires_grad_(), query.requires_grad_(), key.requires_grad_()

    def step(fn):
        for leaf in (x, query, key):
            leaf.grad = None
        out = fn(x, query, key)
        (out ** 2).sum().backward()
        return [out.detach(), x.grad, query.grad, key.grad]

    want = step(read_twice)
    backend = attnres_ge.ge_backend()
    assert_bit_identical(step(torch.compile(read_twice, backend=backend)), want, "output and gradients")
    op = backend.graphs[0].op[-2]
    assert op.input[0] == op.input[2] != op.input[1]


def test_dynamic_token_count_compiles_once():
    backend = attnres_ge.ge_backend()
    compiled = torch.compile(read_views, backend=backend)
    counters.clear()
    for tokens in (5, 9, 2):
        stream, query, key, gain = make_inputs(2, True, 1, tokens=tokens, seed=tokens)
        torch._dynamo.mark_dynamic(stream, 0)
        with torch.no_grad():
            assert_bit_identical(compiled(stream, query, key, gain), read_views(stream, query, key, gain),
                                 f"T={tokens}")
    assert counters["stats"]["unique_graphs"] == 1 and len(backend.graphs) == 1
    assert list(backend.graphs[0].op[-2].input_desc[0].shape.dim) == [-1, H]


def _read_graph(sources=2, query_shape=(1, H)):
    """A forward graph through the builder and the read's converter: `sources` Data, a query, the node."""
    convert = make_converter(READ, ge)
    with ge.Graph("read") as graph:
        rows = [ge.Data(i, torch.float32, [T, H], node_name=f"x{i}") for i in range(sources)]
        query = ge.Data(sources, torch.float32, query_shape, node_name="q")
        ge.NetOutput(list(convert(rows, query, save_statistics=True)))
    return graph.graph_def


def test_builder_writes_a_dynamic_input_and_output_as_ge_does():
    graph = _read_graph(sources=3)
    op = graph.op[-2]
    assert list(op.input) == ["x0:0", "x1:0", "x2:0", "q:0", "", ""]
    assert [d.name for d in op.input_desc] == ["sources0", "sources1", "sources2", "query", "key_norm_weight",
                                               "output_norm_weight"]
    with ge.Graph("grad"):
        rows = [ge.Data(i, torch.float32, [T, H]) for i in range(2)]
        grads = ge.custom_op(READ_GRAD.op_type, inputs={
            "grad_hidden_states": rows[0], "sources": rows, "query": rows[1], "inv_norm": rows[0],
            "probs": rows[0], "output_inv_rms": rows[0]},
            outputs=[("grad_sources", 2), "grad_query", "grad_key_norm_weight", "grad_output_norm_weight"],
            attrs={"eps": ge_attr.Float(1e-5)})
    assert [t.index for t in grads[0]] == [0, 1] and grads[1].index == 2
    assert [d.name for d in grads[1].graph.op(grads[1].node).output_desc][:3] == [
        "grad_sources0", "grad_sources1", "grad_query"]


@pytest.mark.parametrize(("inputs", "outputs", "message"), [
    pytest.param({"sources": None}, None, "required input 'sources' is missing", id="no-sources"),
    pytest.param({"sources": []}, None, "dynamic input 'sources' must be a non-empty list", id="empty-list"),
    pytest.param({}, ["hidden_states", "inv_norm", "probs", "output_inv_rms", "extra"], "outputs must be",
                 id="extra-output"),
])
def test_builder_refuses_a_misspelled_dynamic_input(inputs, outputs, message):
    with ge.Graph("bad"):
        x = ge.Data(0, torch.float32, [T, H])
        given = {"sources": [x], "query": x} | inputs
        with pytest.raises(AttnResInputError, match=message):
            ge.custom_op(READ.op_type, inputs=given, outputs=outputs or READ.prototype.output_names())


def test_local_ge_refuses_misnumbered_dynamic_descs():
    graph = _read_graph(sources=2)
    graph.op[-2].input_desc[1].name = "sources2"  # GE numbers a dynamic input's descs from 0 without gaps
    with pytest.raises(AttnResInputError, match=r"inputs must be \['sources0, sources1, \.\.\.', 'query'"):
        compile_graph(graph)


def test_local_ge_validates_the_fed_tensors_as_eager_does():
    compiled = compile_graph(_read_graph(sources=2, query_shape=(1, -1)))  # H of the query known at run time
    x = torch.randn(T, H)
    assert [t.shape for t in compiled(x, x, torch.randn(1, H))][:3] == [(1, T, H), (T, 2), (1, T, 2)]
    with pytest.raises(AttnResInputError, match="BlockAttnResRead.*query must have shape"):
        compiled.run([x, x, torch.randn(1, H + 1)])
