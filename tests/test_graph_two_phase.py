"""Graph mode for the two-phase ops, BlockAttnResPrepare and BlockAttnResUpdate, with the attnres_ge backend:
the GE nodes their converters build (types, input/output descs in prototype order, eps, update's reference
output), torch.compile against eager bit for bit (h, prepare's states and the caller's partial_block after
the call), one compile for every token count and every valid_blocks value, and bad inputs refused while the
graph is built, before any kernel runs."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from conftest import python_frames
from torch._dynamo.utils import counters

import attnres_ge
from attnres_ge.ge_plugin import ge, ge_ir
from attnres_ge.ge_plugin.converters import local_converters, make_converter
from attnres_ge.ge_plugin.local_ge import compile_graph
from attnres_ge.ge_plugin.op_common import CPP_ENTRY
from attnres_ge.ge_plugin.ops import BLOCK_ATTN_RES_UPDATE
from attnres_ge.op_kernel.launcher import HostRuntime
from attnres_ge.op_proto import PREPARE, UPDATE, AttnResInputError

convert_block_attn_res_update = make_converter(BLOCK_ATTN_RES_UPDATE, ge)

T, N, S, D = 7, 3, 2, 16
EPS = 1e-5
F32, U64, BF16 = ge_ir.DT_FLOAT, ge_ir.DataType.Value("DT_UINT64"), ge_ir.DT_BF16
GE_DTYPE = {torch.float32: F32, torch.float16: ge_ir.DT_FLOAT16, torch.bfloat16: BF16}
OPS = torch.ops.attnres


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def valid_blocks(count: int) -> torch.Tensor:
    return torch.tensor([count], dtype=torch.uint64)


def prepare_inputs(tokens=T, blocks=N, queries=S, hidden=D, valid=N - 1, seed=0):
    """block_res [T, N, D], valid_blocks [1] uint64, pseudo_query [S, D]."""
    generator = torch.Generator().manual_seed(seed)
    block_res = torch.randn(tokens, blocks, hidden, generator=generator)
    pseudo_query = torch.randn(queries, hidden, generator=generator) / hidden**0.5
    return block_res, valid_blocks(valid), pseudo_query


def update_inputs(tokens=T, hidden=D, delta_dtype=torch.bfloat16, seed=1):
    """partial_block [T, D] f32, delta [T, D], pseudo_query [D], and one slot of a prepare's states."""
    block_res, valid, queries = prepare_inputs(tokens, N, S, hidden, seed=seed)
    numerator, logit_max, exp_sum = OPS.block_attn_res_prepare(block_res, valid, queries, eps=EPS)
    generator = torch.Generator().manual_seed(seed + 1)
    partial = torch.randn(tokens, hidden, generator=generator)
    delta = torch.randn(tokens, hidden, generator=generator).to(delta_dtype)
    return partial, delta, queries[1].clone(), numerator[1].clone(), logit_max[1].clone(), exp_sum[1].clone()


def prepare(block_res, valid, pseudo_query):
    return OPS.block_attn_res_prepare(block_res, valid, pseudo_query, eps=EPS)


def update(partial, delta, pseudo_query, numerator, logit_max, exp_sum):
    return OPS.block_attn_res_update(partial, delta, pseudo_query, numerator, logit_max, exp_sum, eps=EPS)


def read(partial, delta, block_res, valid, pseudo_query):
    """One two-phase read: prepare for all S queries, update with slot 1."""
    numerator, logit_max, exp_sum = prepare(block_res, valid, pseudo_query)
    return update(partial, delta, pseudo_query[1], numerator[1], logit_max[1], exp_sum[1])


def _descs(descs):
    return [(d.name, d.dtype, list(d.shape.dim)) for d in descs]


def _attrs(op):
    fields = {name: value.WhichOneof("value") for name, value in op.attr.items()}
    return {name: (field, getattr(op.attr[name], field)) for name, field in fields.items()}


def only_node(graph_def, op_type):
    nodes = [op for op in graph_def.op if op.type == op_type]
    assert len(nodes) == 1, [op.type for op in graph_def.op]
    return nodes[0]


def test_both_ops_have_local_converters():
    converters = local_converters()
    for name in ("block_attn_res_prepare", "block_attn_res_update"):
        converter = converters[getattr(OPS, name).default]
        assert converter.__name__ == f"convert_{name}"


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-T"])
def test_prepare_node(dynamic):
    block_res, valid, queries = prepare_inputs()
    if dynamic:
        torch._dynamo.mark_dynamic(block_res, 0)
    backend = attnres_ge.ge_backend()
    torch.compile(prepare, backend=backend)(block_res, valid, queries)
    [graph] = backend.graphs
    t = -1 if dynamic else T
    assert [op.type for op in graph.op] == ["Data"] * 3 + ["BlockAttnResPrepare", "NetOutput"]
    op = graph.op[3]
    assert list(op.input) == [f"{data.name}:0" for data in graph.op[:3]]
    assert _descs(op.input_desc) == [("block_res", F32, [t, N, D]), ("valid_blocks", U64, [1]),
                                     ("pseudo_query", F32, [S, D])]
    assert [d.name for d in op.input_desc] == PREPARE.input_names()
    assert _attrs(op).keys() == {"eps"} and _attrs(op)["eps"] == ("f", pytest.approx(EPS))
    assert _descs(op.output_desc) == [("numerator", F32, [S, t, D]), ("logit_max", F32, [S, t]),
                                      ("exp_sum", F32, [S, t])]
    assert list(graph.op[-1].input) == [f"{op.name}:{index}" for index in range(3)]


@pytest.mark.parametrize("delta_dtype", [torch.bfloat16, torch.float32, torch.float16], ids=["bf16", "fp32", "fp16"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-T"])
def test_update_node_has_partial_block_as_its_reference_output(delta_dtype, dynamic):
    inputs = update_inputs(delta_dtype=delta_dtype)
    if dynamic:
        for tensor in (inputs[0], inputs[1], *inputs[3:]):
            torch._dynamo.mark_dynamic(tensor, 0)
    backend = attnres_ge.ge_backend()
    with torch.no_grad():
        torch.compile(update, backend=backend)(*inputs)
    [graph] = backend.graphs
    t, dt = (-1 if dynamic else T), GE_DTYPE[delta_dtype]
    assert [op.type for op in graph.op] == ["Data"] * 6 + ["BlockAttnResUpdate", "NetOutput"]
    op = graph.op[6]
    assert list(op.input) == [f"{data.name}:0" for data in graph.op[:6]]
    assert _descs(op.input_desc) == [("partial_block", F32, [t, D]), ("delta", dt, [t, D]), ("pseudo_query", F32, [D]),
                                     ("numerator", F32, [t, D]), ("logit_max", F32, [t]), ("exp_sum", F32, [t])]
    assert [d.name for d in op.input_desc] == UPDATE.input_names()
    assert _attrs(op).keys() == {"eps"} and _attrs(op)["eps"] == ("f", pytest.approx(EPS))
    # partial_block is both an input and the first output (GE's reference tensor); the graph returns only h
    assert _descs(op.output_desc) == [("partial_block", F32, [t, D]), ("h", dt, [t, D])]
    assert list(graph.op[-1].input) == [f"{op.name}:1"]


def assert_same(name, got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{name}: {got.dtype}{list(got.shape)} vs eager"
    assert torch.equal(got, want), f"{name} differs between graph and eager"


@pytest.mark.parametrize("delta_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("path", ["dynamo-graph", "aot-autograd"])
def test_a_two_phase_read_is_bit_identical_to_eager_and_updates_the_callers_partial_block(path, delta_dtype):
    """`dynamo-graph`: nothing needs a gradient, the backend lowers dynamo's graph (the op itself);
    `aot-autograd`: a weight requiring grad sends the graph through AOTAutograd (auto_functionalized_v2)."""
    weight = torch.randn(T, D, requires_grad=path == "aot-autograd")

    def fn(partial, delta, block_res, valid, queries):
        return (read(partial, delta, block_res, valid, queries).float() * weight).sum(dim=1)

    partial, delta, *_ = update_inputs(delta_dtype=delta_dtype)
    state = prepare_inputs()
    before = partial.clone()
    eager_partial, graph_partial = partial.clone(), partial.clone()
    want = fn(eager_partial, delta, *state)
    backend = attnres_ge.ge_backend()
    got = torch.compile(fn, backend=backend)(graph_partial, delta, *state)
    assert_same("result", got, want)
    assert_same("partial_block after the call", graph_partial, eager_partial)
    assert not torch.equal(graph_partial, before), "the caller's partial_block was not updated"
    assert [only_node(g, t).type for g, t in zip(backend.graphs, ["BlockAttnResPrepare", "BlockAttnResUpdate"],
                                                  strict=True)]


@pytest.mark.parametrize("path", ["dynamo-graph", "aot-autograd"])
def test_update_into_a_strided_partial_block_matches_eager(path):
    """A partial_block that is a column slice of a wider buffer: the update lands in the buffer, as eager's."""
    weight = torch.randn(T, D, requires_grad=path == "aot-autograd")
    _, delta, queries, numerator, logit_max, exp_sum = update_inputs()

    def fn(buffer):
        return (update(buffer[:, 1::2], delta, queries, numerator, logit_max, exp_sum).float() * weight).sum()

    buffer = torch.randn(T, 2 * D)
    eager_buffer, graph_buffer = buffer.clone(), buffer.clone()
    want = fn(eager_buffer)
    got = torch.compile(fn, backend=attnres_ge.ge_backend())(graph_buffer)
    assert_same("result", got, want)
    assert_same("buffer under partial_block", graph_buffer, eager_buffer)
    assert torch.equal(graph_buffer[:, ::2], buffer[:, ::2]), "columns outside partial_block changed"


def test_prepare_states_are_bit_identical_to_eager():
    state = prepare_inputs(valid=N)
    want = prepare(*state)
    got = torch.compile(prepare, backend=attnres_ge.ge_backend())(*state)
    for name, a, b in zip(("numerator", "logit_max", "exp_sum"), got, want, strict=True):
        assert_same(name, a, b)


def test_dynamic_tokens_compile_once():
    backend = attnres_ge.ge_backend()
    compiled = torch.compile(read, backend=backend)
    counters.clear()
    for tokens in (5, 9, 17, 2):  # none equal to N, S or D
        partial, delta, *_ = update_inputs(tokens=tokens, seed=tokens)
        state = prepare_inputs(tokens=tokens, seed=tokens)
        graph_partial = partial.clone()
        for tensor in (graph_partial, delta, state[0]):
            torch._dynamo.mark_dynamic(tensor, 0)
        want = read(partial, delta, *state)
        with torch.no_grad():
            got = compiled(graph_partial, delta, *state)
        assert_same(f"h at T={tokens}", got, want)
        assert_same(f"partial_block at T={tokens}", graph_partial, partial)
    assert counters["frames"]["ok"] == 1, dict(counters)
    assert [graph.op[-2].type for graph in backend.graphs] == ["BlockAttnResPrepare", "BlockAttnResUpdate"]


def test_a_new_valid_blocks_value_does_not_recompile():
    """valid_blocks is a tensor the kernel reads when it runs: the same compiled graph serves every count."""
    backend = attnres_ge.ge_backend()
    compiled = torch.compile(prepare, backend=backend)
    block_res, _, queries = prepare_inputs()
    counters.clear()
    results = {}
    for count in (0, 1, N, N + 5, 2):
        want = prepare(block_res, valid_blocks(count), queries)
        got = compiled(block_res, valid_blocks(count), queries)
        for name, a, b in zip(("numerator", "logit_max", "exp_sum"), got, want, strict=True):
            assert_same(f"{name} at valid_blocks={count}", a, b)
        results[count] = got[0]
    assert counters["frames"]["ok"] == 1 and len(backend.graphs) == 1, dict(counters)
    assert not torch.equal(results[1], results[2]), "the count did not reach the kernel"
    assert torch.equal(results[N], results[N + 5]), "a count above N reads all N snapshots"
    assert torch.equal(results[0], torch.zeros_like(results[0])), "no valid snapshot: an empty numerator"


def refuse_kernels(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran: the bad input was not caught while the graph was built")

    monkeypatch.setattr(HostRuntime, "run_kernel", refuse)


def _prepare_call(mangle, **attrs):
    block_res, valid, queries = mangle(*prepare_inputs())
    return (lambda b, v, q: OPS.block_attn_res_prepare(b, v, q, **attrs)), (block_res, valid, queries)


def _update_call(mangle, **attrs):
    tensors = mangle(*update_inputs())
    return (lambda *args: OPS.block_attn_res_update(*args, **attrs)), tensors


BAD_CALLS = [
    pytest.param(_prepare_call, lambda b, v, q: (b[:, :0], v, q), {}, r"BlockAttnResPrepare.*block_res.*1 <= N",
                 id="prepare-N0"),
    pytest.param(_prepare_call, lambda b, v, q: (b, v, q[:, :-1]), {},
                 r"BlockAttnResPrepare.*pseudo_query must have shape", id="prepare-D-mismatch"),
    pytest.param(_prepare_call, lambda b, v, q: (b, torch.zeros(2, dtype=torch.uint64), q), {},
                 r"BlockAttnResPrepare.*valid_blocks must have shape", id="prepare-valid-blocks-shape"),
    pytest.param(_prepare_call, lambda b, v, q: (b, v.to(torch.int64), q), {},
                 r"BlockAttnResPrepare.*valid_blocks must have dtype", id="prepare-valid-blocks-int64"),
    pytest.param(_prepare_call, lambda b, v, q: (b, v, q), {"eps": 0.0}, r"BlockAttnResPrepare.*eps must be finite",
                 id="prepare-eps0"),
    pytest.param(_update_call, lambda p, d, q, n, m, e: (p, d, q, n[:-1], m, e), {},
                 r"BlockAttnResUpdate.*numerator must have shape", id="update-numerator-T"),
    pytest.param(_update_call, lambda p, d, q, n, m, e: (p, d, q[:-1], n, m, e), {},
                 r"BlockAttnResUpdate.*pseudo_query must have shape", id="update-pseudo-query-D"),
    pytest.param(_update_call, lambda p, d, q, n, m, e: (p, d, q, n, m[:, None], e), {},
                 r"BlockAttnResUpdate.*logit_max must be 1-D \[T\] = \[7\], got shape \[7, 1\]",
                 id="update-logit-max-rank"),
    pytest.param(_update_call, lambda p, d, q, n, m, e: (p, d.double(), q, n, m, e), {},
                 r"BlockAttnResUpdate.*delta must have dtype", id="update-delta-float64"),
    pytest.param(_update_call, lambda p, d, q, n, m, e: (p.half(), d, q, n, m, e), {},
                 r"BlockAttnResUpdate.*partial_block must have dtype", id="update-partial-fp16"),
    pytest.param(_update_call, lambda p, d, q, n, m, e: (p, p, q, n, m, e), {},
                 r"BlockAttnResUpdate.*partial_block.*delta", id="update-aliased-delta"),
]


@pytest.mark.parametrize(("make_call", "mangle", "attrs", "message"), BAD_CALLS)
def test_bad_inputs_fail_while_the_graph_is_built(monkeypatch, make_call, mangle, attrs, message):
    fn, args = make_call(mangle, **attrs)  # its inputs made by eager calls
    refuse_kernels(monkeypatch)
    with torch.no_grad(), pytest.raises(Exception, match=message):
        torch.compile(fn, backend=attnres_ge.ge_backend())(*args)


def _update_graph(shapes, dtypes):
    """A GraphDef of our update converter fed by Data nodes of these shapes and dtypes (no torch trace)."""
    with ge.Graph("update") as graph:
        tensors = [ge.Data(index, dtype, shape)
                   for index, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True))]
        h = convert_block_attn_res_update(*tensors, eps=EPS)
        ge.NetOutput([h])
    return graph.graph_def


UPDATE_DTYPES = [torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.float32, torch.float32]
DYNAMIC_UPDATE_SHAPES = [[-1, D], [-1, D], [D], [-1, D], [-1], [-1]]  # any token count


def test_the_local_ge_checks_an_update_graph_it_did_not_trace():
    """A GraphDef from elsewhere (no fake tensors ran): the local GE's InferShape names the node, op and tensor."""
    compiled = compile_graph(_update_graph(DYNAMIC_UPDATE_SHAPES, UPDATE_DTYPES))
    node = only_node(compiled.graph_def, "BlockAttnResUpdate")
    assert _descs(node.output_desc) == [("partial_block", F32, [-1, D]), ("h", BF16, [-1, D])]
    partial, *rest = update_inputs()
    eager_partial = partial.clone()
    want = update(eager_partial, *rest)
    [got] = compiled(partial, *rest)
    assert_same("h", got, want)
    assert_same("partial_block", partial, eager_partial)

    bad = [[T, D], [T, D], [D], [T, D + 1], [T], [T]]
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttnResUpdate' .*numerator must have shape"):
        compile_graph(_update_graph(bad, UPDATE_DTYPES))


def test_the_local_ge_refuses_a_delta_sharing_memory_with_partial_block_at_run_time(monkeypatch):
    """Two graph inputs that are views of one buffer: the node refuses them as the eager op does (the kernel
    would read values it has already overwritten), naming the node and both tensors."""
    dtypes = [torch.float32] * 6  # a float32 delta, so that it can view partial_block's buffer
    compiled = compile_graph(_update_graph(DYNAMIC_UPDATE_SHAPES, dtypes))
    _, _, queries, numerator, logit_max, exp_sum = update_inputs()
    buffer = torch.randn(T, D + 4)
    partial, delta = buffer[:, :D], buffer[:, 4:]
    with pytest.raises(AttnResInputError, match="updated in place and must not share memory with delta"):
        update(partial, delta, queries, numerator, logit_max, exp_sum)
    refuse_kernels(monkeypatch)
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttnResUpdate' .*BlockAttnResUpdate.*partial_block is "
                                                 r"updated in place and must not share memory with delta"):
        compiled(partial, delta, queries, numerator, logit_max, exp_sum)


def _planned_update_graph():
    """An update graph whose C++ node has planned update_inputs()' signature (run once on a copy), those
    inputs, and what eager gives for them: (graph, partial, the other inputs, eager's partial, eager's h)."""
    compiled = compile_graph(_update_graph(DYNAMIC_UPDATE_SHAPES, UPDATE_DTYPES))
    partial, *rest = update_inputs()
    compiled(partial.clone(), *rest)
    eager_partial = partial.clone()
    return compiled, partial, rest, eager_partial, update(eager_partial, *rest)


@pytest.mark.skipif(not CPP_ENTRY, reason="the ops' C++ entry is not built")
def test_a_planned_update_graph_runs_in_cpp_in_place():
    """The C++ GraphNode runs a planned update graph without Python: partial_block, the very tensor fed,
    written in place with its version bumped, and h with eager's bits."""
    compiled, partial, rest, eager_partial, want = _planned_update_graph()
    assert compiled.node is not None
    address, version = partial.data_ptr(), partial._version
    results = []
    assert python_frames(lambda: results.extend(compiled.node([partial, *rest]))) == []
    assert_same("h", results[0], want)
    assert_same("partial_block", partial, eager_partial)
    assert partial.data_ptr() == address and partial._version == version + 1


@pytest.mark.skipif(not CPP_ENTRY, reason="the ops' C++ entry is not built")
def test_a_planned_update_graph_leaves_what_it_cannot_write_in_place_to_python(monkeypatch):
    """A strided partial_block of a planned signature is updated through a copy, as eager does; one that
    shares memory with numerator is refused, naming the node and both tensors, before any kernel runs."""
    compiled, partial, rest, eager_partial, want = _planned_update_graph()
    strided = torch.empty(D, T).t()
    strided.copy_(partial)
    [h] = compiled(strided, *rest)
    assert_same("h", h, want)
    assert_same("partial_block", strided.contiguous(), eager_partial)
    delta, queries, numerator, logit_max, exp_sum = rest
    before = numerator.clone()
    refuse_kernels(monkeypatch)
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttnResUpdate' .*partial_block is updated in place "
                                                 r"and must not share memory with numerator"):
        compiled(numerator, delta, queries, numerator, logit_max, exp_sum)
    assert_same("numerator", numerator, before)


@pytest.mark.parametrize("path", ["dynamo-graph", "aot-autograd"])
def test_partial_block_read_after_the_update_in_the_same_graph_sees_the_update(path):
    """The graph reads partial_block before and after the in-place update: each read sees the bits eager does."""
    weight = torch.tensor(2.0, requires_grad=path == "aot-autograd")
    _, delta, queries, numerator, logit_max, exp_sum = update_inputs()

    def fn(partial):
        before = partial * weight
        h = update(partial, delta, queries, numerator, logit_max, exp_sum)
        return before, h.float() * weight, partial * weight

    partial = update_inputs()[0]
    eager_partial, graph_partial = partial.clone(), partial.clone()
    want = fn(eager_partial)
    got = torch.compile(fn, backend=attnres_ge.ge_backend())(graph_partial)
    for name, a, b in zip(("before", "h", "after"), got, want, strict=True):
        assert_same(name, a, b)
    assert_same("partial_block", graph_partial, eager_partial)
    assert not torch.equal(want[0], want[2]), "the update changed nothing"
