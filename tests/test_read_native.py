"""The native kernels of the general read, BlockAttnResRead (op_kernel/csrc/read_kernel.h, through
op_kernel/native.read_forward and read_backward), against a float64 evaluation of the read's formulas
written here: the forward directly, the backward by torch's float64 autograd of that forward (so the
kernel's hand-derived backward is checked independently). Plus: the same bits on every instruction set
path and for one and two threads, T = 0, L = 130, long rows, NaN propagation.

The backward is given the statistics the native forward saved (float32 inv_norm, probs, output_inv_rms),
as the op is; the reference takes their values too (see reference()). The input gradients' terms cancel,
by far where a row's RMS is near eps (r in the hundreds) or an output norm makes the output gradient
orthogonal to y, so, as for the other ops' gradients through float32 statistics (docs/contract.md), they
are held to the table's tolerance plus STATISTICS_ALLOWANCE times the size of their terms before they
cancel (term_scale).
"""

from __future__ import annotations

import pytest
import torch
from conftest import DTYPE_IDS

from attnres_ge.op_kernel.reference import STATISTICS_ALLOWANCE, max_violation

native = pytest.importorskip("attnres_ge.op_kernel.native", reason="the native kernels are not built")
if not hasattr(native, "read_forward") or not hasattr(native._native, "read_forward"):
    pytest.skip("the native module has no BlockAttnResRead kernels (rebuild it)", allow_module_level=True)

DTYPES = [pytest.param(dtype, id=name) for dtype, name in DTYPE_IDS.items()]
EPS, OUTPUT_EPS = 1e-6, 1e-5


def f32(x: float) -> float:
    """An attribute as GE stores it: rounded to float32."""
    return torch.tensor(x, dtype=torch.float32).item()


def make_case(tokens, rows, queries, hidden, dtype, *, key_weight=True, weight_rows=1, seed=0, scale=1.3):
    """Inputs of one read: strided sources (views of a [T, N, H] tensor and a [T, H] slice of a wider
    one), rows of RMS 1 and of RMS ~1e-3 (where eps matters), and the weights."""
    generator = torch.Generator().manual_seed(seed)
    stacked = torch.randn(tokens, max(rows - 1, 1), hidden, generator=generator)
    stacked[:, ::3] *= 1e-3  # every third block near eps
    stacked = stacked.to(dtype)
    wide = torch.randn(tokens, hidden + 7, generator=generator).to(dtype)
    sources = [stacked[:, i] for i in range(rows - 1)] + [wide[:, :hidden]]
    query = torch.randn(queries, hidden, generator=generator) * 2 / hidden**0.5
    key = 1 + 0.2 * torch.randn(hidden, generator=generator) if key_weight else None
    gain = None if weight_rows is None else 1 + 0.2 * torch.randn(weight_rows, hidden, generator=generator)
    return dict(sources=sources, query=query, key_norm_weight=key, output_norm_weight=gain, scale=scale)


def run_forward(case, normalize_values, *, keep=True):
    sources, query, gain = case["sources"], case["query"], case["output_norm_weight"]
    tokens, hidden = sources[0].shape
    rows, queries = len(sources), query.shape[0]
    # NaN-filled, so that an element the kernel forgets to write shows up.
    out = torch.full((queries, tokens, hidden), float("nan"), dtype=sources[0].dtype)
    inv_norm = torch.full((tokens, rows), float("nan")) if keep else None
    probs = torch.full((queries, tokens, rows), float("nan")) if keep else None
    output_inv_rms = torch.full((queries, tokens), float("nan")) if keep and gain is not None else None
    native.read_forward(sources, query, case["key_norm_weight"], gain, out, inv_norm, probs, output_inv_rms, EPS,
                        OUTPUT_EPS, case["scale"], normalize_values)
    return out, inv_norm, probs, output_inv_rms


def run_backward(case, normalize_values, grad_out, inv_norm, probs, output_inv_rms):
    sources, query, key, gain = case["sources"], case["query"], case["key_norm_weight"], case["output_norm_weight"]
    grads = dict(
        grad_sources=[torch.full(sources[0].shape, float("nan"), dtype=sources[0].dtype) for _ in sources],
        grad_query=torch.full(query.shape, float("nan")),
        grad_key_norm_weight=None if key is None else torch.full(key.shape, float("nan")),
        grad_output_norm_weight=None if gain is None else torch.full(gain.shape, float("nan")),
    )
    native.read_backward(grad_out, sources, query, key, gain, inv_norm, probs, output_inv_rms, grads["grad_sources"],
                         grads["grad_query"], grads["grad_key_norm_weight"], grads["grad_output_norm_weight"], EPS,
                         OUTPUT_EPS, case["scale"], normalize_values)
    return grads


def given(exact: torch.Tensor, value: torch.Tensor | None) -> torch.Tensor:
    """`exact` with the value `value` (a statistic the kernel was given) but exact's derivative."""
    return exact if value is None else exact + (value.double() - exact).detach()


def reference(case, normalize_values, grad_out=None, stats=(None, None, None)):
    """(out, inv_norm [T, L], probs [S, T, L], output_inv_rms [S, T] and, given grad_out, the gradients),
    float64, by the read's formulas; stats: the float32 (inv_norm, probs, output_inv_rms) the backward was
    given, whose values the evaluation then uses (with the exact functions' derivatives)."""
    leaves = {
        "sources": [source.double().requires_grad_() for source in case["sources"]],
        "query": case["query"].double().requires_grad_(),
        "key": None if case["key_norm_weight"] is None else case["key_norm_weight"].double().requires_grad_(),
        "gain": None if case["output_norm_weight"] is None else case["output_norm_weight"].double().requires_grad_(),
    }
    x = torch.stack(leaves["sources"])  # [L, T, H]
    hidden = x.shape[-1]
    r = given(torch.rsqrt(x.pow(2).mean(-1) + f32(EPS)).transpose(0, 1), stats[0])  # [T, L]
    w = 1.0 if leaves["key"] is None else leaves["key"]
    z = f32(case["scale"]) * r.unsqueeze(0) * torch.einsum("sh,lth->stl", leaves["query"] * w, x)  # [S, T, L]
    p = given(torch.softmax(z, dim=-1), stats[1])
    v = x * r.transpose(0, 1).unsqueeze(-1) if normalize_values else x
    y = torch.einsum("stl,lth->sth", p, v)
    rho = None
    if leaves["gain"] is not None:
        rho = given(torch.rsqrt(y.pow(2).mean(-1) + f32(OUTPUT_EPS)), stats[2])  # [S, T]
        y = leaves["gain"].reshape(-1, 1, hidden) * y * rho.unsqueeze(-1)
    if grad_out is not None:
        y.backward(grad_out.double())
    grad = lambda leaf: None if leaf is None else leaf.grad  # noqa: E731
    return dict(out=y.detach(), inv_norm=r.detach(), probs=p.detach(), output_inv_rms=None if rho is None else
                rho.detach(), grad_sources=[leaf.grad for leaf in leaves["sources"]], grad_query=grad(leaves["query"]),
                grad_key_norm_weight=grad(leaves["key"]), grad_output_norm_weight=grad(leaves["gain"]))


def term_scale(case, normalize_values, grad_out, inv_norm, probs, output_inv_rms):
    """[L, T, H] float64: each input gradient's terms in the backward's formulas, in absolute value and
    added up (every dot and sum of them over its terms' absolute values): what float32 rounding of the
    statistics and of the kernel's own arithmetic scales with."""
    x = torch.stack([source.double() for source in case["sources"]]).abs()  # [L, T, H]
    hidden = x.shape[-1]
    r, p = inv_norm.double().transpose(0, 1), probs.double()  # [L, T], [S, T, L]
    key = case["key_norm_weight"]
    qw = case["query"].double().abs() * (1.0 if key is None else key.double().abs())  # [S, H]
    gy = grad_out.double().abs()  # [S, T, H]
    v = x * r.unsqueeze(-1) if normalize_values else x
    if case["output_norm_weight"] is not None:
        rho = output_inv_rms.double().unsqueeze(-1)
        y = torch.einsum("stl,lth->sth", p, v)
        gg = case["output_norm_weight"].double().abs().reshape(-1, 1, hidden) * gy
        gy = rho * gg + y * rho**3 / hidden * (gg * y).sum(-1, keepdim=True)
    a = torch.einsum("sth,lth->stl", gy, v)
    dz = abs(f32(case["scale"])) * p * (a + (p * a).sum(-1, keepdim=True))
    d = torch.einsum("sh,lth->stl", qw, x)
    c = torch.einsum("stl,sth,lth->lt", p, gy, x) if normalize_values else 0.0
    beta = p * r.transpose(0, 1).unsqueeze(0) if normalize_values else p
    return (torch.einsum("stl,sh->lth", dz * r.transpose(0, 1).unsqueeze(0), qw)
            + torch.einsum("stl,sth->lth", beta, gy)
            + x * (r**3 / hidden * ((dz * d).sum(0).transpose(0, 1) + c)).unsqueeze(-1))


def assert_within(name, actual, expected, dtype, whole_tensor=False, allowance=None):
    error, past = max_violation(actual, expected, dtype, whole_tensor=whole_tensor, allowance=allowance)
    assert past <= 0, f"{name}: max error {error:.3g}, past the {dtype} tolerance by {past:.3g}"


def check_against_reference(case, normalize_values, seed=1):
    dtype = case["sources"][0].dtype
    out, inv_norm, probs, output_inv_rms = run_forward(case, normalize_values)
    expected_forward = reference(case, normalize_values)
    generator = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(out.shape, generator=generator).to(dtype)
    assert_within("out", out, expected_forward["out"], dtype)
    assert_within("inv_norm", inv_norm, expected_forward["inv_norm"], torch.float32)
    assert_within("probs", probs, expected_forward["probs"], torch.float32)
    if output_inv_rms is not None:
        assert_within("output_inv_rms", output_inv_rms, expected_forward["output_inv_rms"], torch.float32)
    grads = run_backward(case, normalize_values, grad_out, inv_norm, probs, output_inv_rms)
    expected = reference(case, normalize_values, grad_out, (inv_norm, probs, output_inv_rms))
    scales = term_scale(case, normalize_values, grad_out, inv_norm, probs, output_inv_rms)
    for i, (actual, want) in enumerate(zip(grads["grad_sources"], expected["grad_sources"], strict=True)):
        assert_within(f"grad_sources[{i}]", actual, want, dtype, allowance=STATISTICS_ALLOWANCE * scales[i])
    for name in ("grad_query", "grad_key_norm_weight", "grad_output_norm_weight"):
        if expected[name] is not None:
            assert_within(name, grads[name], expected[name], torch.float32, whole_tensor=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalize_values", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("key_weight", [False, True], ids=["nokey", "key"])
@pytest.mark.parametrize("weight_rows", [None, 1, "S"], ids=["nonorm", "W1", "WS"])
@pytest.mark.parametrize("queries", [1, 3])
def test_matches_the_float64_formulas(dtype, normalize_values, key_weight, weight_rows, queries):
    rows = {None: 9, 1: 2, "S": 9}[weight_rows]
    case = make_case(67, rows, queries, 37 if queries == 1 else 100, dtype, key_weight=key_weight,
                     weight_rows=queries if weight_rows == "S" else weight_rows)
    check_against_reference(case, normalize_values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "rows", "queries", "hidden"),
                         [(1, 1, 3, 100), (200, 2, 1, 37), (5, 130, 3, 37), (3, 9, 3, 2048)],
                         ids=["L1", "T200", "L130", "H2048"])
def test_shapes_match_the_float64_formulas(dtype, tokens, rows, queries, hidden):
    case = make_case(tokens, rows, queries, hidden, dtype, weight_rows=queries, scale=hidden**-0.5)
    check_against_reference(case, True)
    check_against_reference(case, False)


def test_long_rows_match_the_float64_formulas():
    """H = 65536: a token's rows (2.3 MiB) no longer fit in L2; one dtype (the reference is the slow part)."""
    check_against_reference(make_case(2, 9, 2, 65536, torch.float32, weight_rows=1, scale=65536**-0.5), True)


def all_outputs(case, normalize_values):
    out, inv_norm, probs, output_inv_rms = run_forward(case, normalize_values)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    grads = run_backward(case, normalize_values, grad_out, inv_norm, probs, output_inv_rms)
    return [out, inv_norm, probs, output_inv_rms, *grads["grad_sources"], grads["grad_query"],
            grads["grad_key_norm_weight"], grads["grad_output_norm_weight"]]


def assert_same_bits(first, second, what):
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        if a is None:
            assert b is None
            continue
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                           b.view(torch.uint8) if b.dtype != torch.uint8 else b), f"output {i} differs {what}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_bits_on_every_path_and_thread_count(dtype):
    saved_path, saved_threads = native.isa_path(), torch.get_num_threads()
    cases = [(make_case(131, 9, 3, 100, dtype, weight_rows=3), True),
             (make_case(70, 4, 1, 2048, dtype, weight_rows=1, key_weight=False), False)]
    try:
        for case, normalize_values in cases:
            native.use_isa_path("scalar")
            torch.set_num_threads(1)
            expected = all_outputs(case, normalize_values)
            for path in native.available_isa_paths():
                native.use_isa_path(path)
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    assert_same_bits(all_outputs(case, normalize_values), expected, f"on {path}, {threads} threads")
    finally:
        native.use_isa_path(saved_path)
        torch.set_num_threads(saved_threads)


STREAMED_OUTPUT_BYTES = native.STREAM_MIN_BYTES  # outputs of this size and more go by streaming stores


@pytest.mark.parametrize("dtype", DTYPES)
def test_streamed_output_has_the_same_bits(dtype):
    """A large output, aligned (streaming stores) and one element off (usual stores: can_stream refuses it),
    on every path: the same bits."""
    hidden, queries = 2048, 2
    tokens = STREAMED_OUTPUT_BYTES // (queries * hidden * dtype.itemsize)
    case = make_case(tokens, 2, queries, hidden, dtype, weight_rows=None, key_weight=False)
    saved_path = native.isa_path()
    try:
        for path in native.available_isa_paths():
            native.use_isa_path(path)
            outputs = []
            for offset in (0, 1):
                out = torch.full((queries * tokens * hidden + offset,), float("nan"), dtype=dtype)[offset:]
                out = out.view(queries, tokens, hidden)
                native.read_forward(case["sources"], case["query"], None, None, out, None, None, None, EPS,
                                    OUTPUT_EPS, case["scale"], True)
                outputs.append(out)
            assert_same_bits(outputs[:1], outputs[1:], f"streamed and stored on {path}")
    finally:
        native.use_isa_path(saved_path)


def test_no_tokens_writes_nothing_and_zero_gradients():
    case = make_case(0, 3, 2, 37, torch.float32, weight_rows=2)
    out, inv_norm, probs, output_inv_rms = run_forward(case, False)
    assert out.shape == (2, 0, 37) and inv_norm.numel() == probs.numel() == output_inv_rms.numel() == 0
    grads = run_backward(case, False, torch.empty(2, 0, 37), inv_norm, probs, output_inv_rms)
    for name in ("grad_query", "grad_key_norm_weight", "grad_output_norm_weight"):
        assert torch.equal(grads[name], torch.zeros_like(grads[name])), name


def test_nan_propagates_to_its_token_only():
    case = make_case(9, 3, 2, 37, torch.float32, weight_rows=1)
    case["sources"][1][4, 5] = float("nan")
    out, inv_norm, probs, output_inv_rms = run_forward(case, True)
    assert out[:, 4].isnan().all() and probs[:, 4].isnan().all()
    others = torch.arange(9) != 4
    assert out[:, others].isfinite().all() and probs[:, others].isfinite().all()
    grads = run_backward(case, True, torch.ones_like(out), inv_norm, probs, output_inv_rms)
    for grad in grads["grad_sources"]:
        assert grad[4].isnan().any() and grad[others].isfinite().all()
