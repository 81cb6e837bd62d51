"""torch.compile with the attnres_ge backend: bit-identical to eager, the GraphDefs it builds, dynamic T."""

from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import attnres_ge
from attnres_ge.ge_plugin import ge_ir
from attnres_ge.op_kernel.launcher import HostRuntime

T, N, H = 6, 3, 16
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in (torch.float32, torch.float16, torch.bfloat16)]
GE_DTYPE = {torch.float32: ge_ir.DT_FLOAT, torch.float16: ge_ir.DT_FLOAT16, torch.bfloat16: ge_ir.DT_BF16}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_layer(dtype=torch.float32, hidden=H, seed=0):
    torch.manual_seed(seed)
    layer = attnres_ge.BlockAttnRes(hidden, dtype=dtype)
    with torch.no_grad():
        layer.proj_weight.normal_()
        layer.norm_weight.uniform_(0.5, 1.5)
    return layer


def make_inputs(tokens=T, blocks=N, hidden=H, dtype=torch.float32, seed=1, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    partial = torch.randn(tokens, hidden, generator=generator).to(dtype).requires_grad_(requires_grad)
    blocks_res = torch.randn(tokens, blocks, hidden, generator=generator).to(dtype).requires_grad_(requires_grad)
    return partial, blocks_res


def loss_of(layer, partial, block_res):
    return (layer(partial, block_res).float() ** 2).sum()


def train_step(step_fn, layer, partial, block_res):
    """Loss and the gradients of all four tensors after one forward+backward."""
    for tensor in (partial, block_res, *layer.parameters()):
        tensor.grad = None
    loss = step_fn(layer, partial, block_res)
    loss.backward()
    return {"loss": loss.detach(), "grad_partial_block": partial.grad, "grad_block_res": block_res.grad,
            "grad_proj_weight": layer.proj_weight.grad, "grad_norm_weight": layer.norm_weight.grad}


def assert_bit_identical(got: dict, want: dict):
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs between graph and eager"


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_only_is_bit_identical(dtype):
    layer = make_layer(dtype)
    partial, block_res = make_inputs(dtype=dtype)
    backend = attnres_ge.ge_backend()
    with torch.no_grad():
        want = layer(partial, block_res)
        got = torch.compile(layer, backend=backend)(partial, block_res)
    assert torch.equal(got, want)
    [graph] = backend.graphs
    assert graph.op[-2].attr["need_backward"].b is False


def test_graphs_without_gradients_skip_aot_autograd(monkeypatch):
    layer = make_layer()
    partial, block_res = make_inputs()
    backend = attnres_ge.ge_backend()

    def refuse(*args):
        raise AssertionError("AOTAutograd ran for a graph in which nothing needs a gradient")

    monkeypatch.setattr(backend, "_aot", refuse)
    with torch.no_grad():  # the layer's parameters require grad, but grad mode is off
        assert torch.equal(torch.compile(layer, backend=backend)(partial, block_res), layer(partial, block_res))
    ops = torch.ops.attnres  # grad mode on, no tensor requiring grad
    want = ops.block_attention_residuals(partial, block_res, layer.proj_weight.detach(),
                                         layer.norm_weight.detach(), need_backward=True)
    got = torch.compile(ops.block_attention_residuals, backend=backend)(
        partial, block_res, layer.proj_weight.detach(), layer.norm_weight.detach(), need_backward=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert len(backend.fx_graphs) == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_and_backward_of_one_layer_are_bit_identical(dtype):
    layer = make_layer(dtype)
    partial, block_res = make_inputs(dtype=dtype, requires_grad=True)
    want = train_step(loss_of, layer, partial, block_res)
    backend = attnres_ge.ge_backend()
    got = train_step(torch.compile(loss_of, backend=backend), layer, partial, block_res)
    assert_bit_identical(got, want)
    assert [graph.op[-2].type for graph in backend.graphs] == ["BlockAttentionResiduals",
                                                               "BlockAttentionResidualsGrad"]


def _attr(op, name):
    value = op.attr[name]
    field = value.WhichOneof("value")
    return field, getattr(value, field)


def _descs(descs):
    return [(d.name, d.dtype, list(d.shape.dim)) for d in descs]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-T"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graphdefs_the_backend_builds(dtype, dynamic):
    layer = make_layer(dtype)
    partial, block_res = make_inputs(dtype=dtype, requires_grad=True)
    if dynamic:  # only the token count; dynamic=True would make N unknown too
        torch._dynamo.mark_dynamic(partial, 0)
        torch._dynamo.mark_dynamic(block_res, 0)
    backend = attnres_ge.ge_backend()
    train_step(torch.compile(loss_of, backend=backend), layer, partial, block_res)
    forward, backward = backend.graphs
    t = -1 if dynamic else T
    dt, f32 = GE_DTYPE[dtype], ge_ir.DT_FLOAT

    op = forward.op[-2]
    assert [o.type for o in forward.op] == ["Data"] * 4 + ["BlockAttentionResiduals", "NetOutput"]
    data_names = [o.name for o in forward.op[:4]]
    assert list(op.input) == [f"{name}:0" for name in data_names]
    assert [_attr(o, "index") for o in forward.op[:4]] == [("i", i) for i in range(4)]
    assert _descs(op.input_desc) == [("partial_block", dt, [t, H]), ("block_res", dt, [t, N, H]),
                                     ("proj_weight", dt, [1, H]), ("norm_weight", dt, [H])]
    assert _attr(op, "valid_block_num") == ("i", -1)
    assert _attr(op, "need_backward") == ("b", True)
    assert _attr(op, "norm_eps")[0] == "f" and _attr(op, "norm_eps")[1] == pytest.approx(1e-6)
    assert _descs(op.output_desc) == [("hidden_states", dt, [t, H]), ("inv_norm", f32, [t, N + 1]),
                                      ("probs", f32, [t, N + 1])]
    assert list(forward.op[-1].input) == [f"{op.name}:{i}" for i in range(3)]

    op = backward.op[-2]
    assert [o.type for o in backward.op] == ["Data"] * 7 + ["BlockAttentionResidualsGrad", "NetOutput"]
    assert list(op.input) == [f"{o.name}:0" for o in backward.op[:7]]
    assert _descs(op.input_desc) == [
        ("partial_block", dt, [t, H]), ("block_res", dt, [t, N, H]), ("proj_weight", dt, [1, H]),
        ("norm_weight", dt, [H]), ("grad_hidden_states", dt, [t, H]), ("inv_norm", f32, [t, N + 1]),
        ("probs", f32, [t, N + 1])]
    assert dict(op.attr).keys() == {"valid_block_num"} and _attr(op, "valid_block_num") == ("i", 0)
    assert _descs(op.output_desc) == [("grad_partial_block", dt, [t, H]), ("grad_block_res", dt, [t, N, H]),
                                      ("grad_proj_weight", dt, [1, H]), ("grad_norm_weight", dt, [H])]


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_tokens_compile_once_and_match_eager(how):
    layer = make_layer()
    backend = attnres_ge.ge_backend()
    compiled = torch.compile(loss_of, backend=backend, dynamic=True if how == "dynamic=True" else None)
    counters.clear()
    for tokens in (5, 9, 17, 40, 2):  # none equal to N or H, so duck sizing adds no guard
        partial, block_res = make_inputs(tokens=tokens, requires_grad=True, seed=tokens)
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(partial, 0)
            torch._dynamo.mark_dynamic(block_res, 0)
        want = train_step(loss_of, layer, partial, block_res)
        got = train_step(compiled, layer, partial, block_res)
        assert_bit_identical(got, want)
    assert counters["frames"]["ok"] == 1, f"one compile for every token count, dynamo counted {dict(counters)}"
    assert counters["stats"]["unique_graphs"] == 1
    assert len(backend.graphs) == 2  # one forward and one backward GE graph, ever
    assert all(list(graph.op[-2].output_desc[0].shape.dim)[0] == -1 for graph in backend.graphs)


def test_backend_is_registered_by_name_and_dumps_graphs(tmp_path):
    layer = make_layer()
    partial, block_res = make_inputs(requires_grad=True)
    want = train_step(loss_of, layer, partial, block_res)
    compiled = torch.compile(loss_of, backend="attnres_ge", options={"dump_path": str(tmp_path)})
    assert_bit_identical(train_step(compiled, layer, partial, block_res), want)
    dumped = sorted(path.name for path in tmp_path.glob("*.pbtxt"))
    assert len(dumped) == 2
    assert dumped[0].endswith("block_attention_residuals.pbtxt")
    assert dumped[1].endswith("block_attention_residuals_backward.pbtxt")


@pytest.fixture
def kernels_must_not_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran: the bad input was not caught at compile time")

    monkeypatch.setattr(HostRuntime, "run_kernel", refuse)


BAD_CALLS = [
    pytest.param(lambda p, b, w, n: (p, b[:-1], w, n), {}, "block_res must have shape", id="tokens-mismatch"),
    pytest.param(lambda p, b, w, n: (p, b, w[:, :-1], n), {}, "proj_weight must have shape", id="proj-shape"),
    pytest.param(lambda p, b, w, n: (p, b.half(), w, n), {}, "block_res must have the dtype", id="mixed-dtype"),
    pytest.param(lambda p, b, w, n: (p.double(), b.double(), w.double(), n.double()), {}, "must have dtype in",
                 id="float64"),
    pytest.param(lambda p, b, w, n: (p, b[:, :0], w, n), {}, r"1 <= N", id="N0"),
    pytest.param(lambda p, b, w, n: (p, b, w, n), {"norm_eps": 0.0}, "norm_eps must be finite and > 0", id="eps0"),
    pytest.param(lambda p, b, w, n: (p, b, w, n), {"valid_block_num": 7}, "valid_block_num is reserved",
                 id="valid-block-num"),
]


@pytest.mark.parametrize("backend", ["attnres_ge", "inductor"])
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_valid_block_num_taken_from_the_shape_compiles_as_n_varies(backend, dynamic, requires_grad):
    """valid_block_num=block_res.shape[1] (a SymInt under dynamic shapes) is specialised under a guard."""
    layer = make_layer()

    def fn(partial, block_res):
        hidden, _, _ = torch.ops.attnres.block_attention_residuals(
            partial, block_res, layer.proj_weight, layer.norm_weight, block_res.shape[1], 1e-6, requires_grad)
        return (hidden.float() ** 2).sum()

    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for tokens, blocks in [(5, 2), (7, 3), (9, 4), (7, 3)]:
        results = []
        for call in (fn, compiled):
            partial, block_res = make_inputs(tokens, blocks, requires_grad=requires_grad)
            loss = call(partial, block_res)
            if requires_grad:
                loss.backward()
            results.append([loss.detach(), *((partial.grad, block_res.grad) if requires_grad else ())])
        eager, graph = results
        same = torch.equal if backend == "attnres_ge" else functools.partial(torch.allclose, rtol=1e-5, atol=1e-6)
        assert all(same(a, b) for a, b in zip(eager, graph, strict=True)), f"N={blocks}: graph differs from eager"


@pytest.mark.parametrize("norm_eps", [1e-6, 1e-45, 1e-46, 1e-50, 1e-300, 3.4e38, 3.5e38, 1e300])
def test_graph_mode_accepts_and_rejects_norm_eps_exactly_as_eager(norm_eps):
    """norm_eps as the float32 GE stores: an eps that rounds to 0 or overflows is rejected everywhere, naming it."""
    partial, block_res = make_inputs()
    partial[0].zero_()
    block_res[0].zero_()  # an all-zero row: only norm_eps keeps its statistics finite
    layer = make_layer()
    args = (partial, block_res, layer.proj_weight.detach(), layer.norm_weight.detach())

    def fn(p, b, w, n):
        return torch.ops.attnres.block_attention_residuals(p, b, w, n, -1, norm_eps, True)

    outcomes = []
    for call in (fn, torch.compile(fn, backend="attnres_ge")):
        try:
            outcomes.append(call(*args))
        except Exception as error:  # noqa: BLE001 - the kind of error is what is compared
            assert "attribute norm_eps must be finite and > 0 as a float32" in str(error), repr(error)
            outcomes.append(None)
        torch._dynamo.reset()
    eager, graph = outcomes
    verdict = "rejects" if eager is None else "accepts"
    assert (eager is None) == (graph is None), f"eager {verdict} norm_eps={norm_eps}, graph mode does not"
    if eager is not None:
        assert all(torch.isfinite(t).all() for t in eager), "an accepted eps keeps a zero row finite"
        assert all(torch.equal(a, b) for a, b in zip(eager, graph, strict=True))


@pytest.mark.parametrize(("mangle", "attrs", "message"), BAD_CALLS)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_bad_inputs_fail_during_compile(kernels_must_not_run, mangle, attrs, message, dynamic):
    layer = make_layer()
    partial, block_res = make_inputs()
    args = mangle(partial, block_res, layer.proj_weight.detach(), layer.norm_weight.detach())
    call = {"valid_block_num": -1, "norm_eps": 1e-6, **attrs}

    def fn(p, b, w, n):
        return torch.ops.attnres.block_attention_residuals(p, b, w, n, call["valid_block_num"], call["norm_eps"])

    with pytest.raises(Exception, match=message):
        torch.compile(fn, backend=attnres_ge.ge_backend(), dynamic=dynamic)(*args)
