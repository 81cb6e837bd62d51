"""The general read (torch.ops.attnres.block_attn_res_read / _backward, attnres_ge.fused_attnres) against the float64
reference, on every kernel implementation: outputs, statistics and every gradient, the API's shapes, opcheck, and
the errors for bad input."""

from __future__ import annotations

import re

import pytest
import torch

import attnres_ge
from attnres_ge.op_kernel import KERNELS, native_available
from attnres_ge.op_kernel.reference import general_read_reference, max_violation
from attnres_ge.op_proto.op_def import AttnResInputError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
IMPLEMENTATIONS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="the native kernels are not built"))]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request):
    before = KERNELS.implementation
    KERNELS.set_implementation(request.param)
    yield request.param
    KERNELS.set_implementation(before)


def make_sources(tokens, hidden, count, dtype, seed=0, tiny_rows=False):
    """`count` sources [tokens, hidden]; with tiny_rows some rows have an RMS near 1e-3, where eps matters."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(count, tokens, hidden, generator=generator)
    if tiny_rows:
        rows = rows * 10 ** (-3 * torch.rand(count, tokens, 1, generator=generator))
    return [row.to(dtype) for row in rows]


def parameters(hidden, queries, key_weighted, gain_rows, seed=1):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(queries, hidden, generator=generator) / hidden ** 0.25
    key = 0.5 + torch.rand(hidden, generator=generator) if key_weighted else None
    gain = None if gain_rows is None else 0.5 + torch.rand(*gain_rows, hidden, generator=generator)
    return query, key, gain


def assert_within(name, actual, expected, dtype, whole_tensor=False):
    error, past = max_violation(actual, expected, dtype, whole_tensor=whole_tensor)
    assert past <= 0, f"{name} ({dtype}): max |err| {error:.3e}, past the tolerance by {past:.3e}"


CASES = {  # id: (T, H, L, S, key weight, output-norm weight rows (None: no output norm), normalize_values, scale)
    "T7-H37-L1-S1-plain": (7, 37, 1, 1, True, None, False, 1.0),
    "T9-H37-L5-S3-unweighted-gain-per-query": (9, 37, 5, 3, False, (3,), True, 37 ** -0.5),
    "T6-H100-L9-S1-shared-gain": (6, 100, 9, 1, True, (), False, 1.3),
    "T4-H33-L130-S3-both": (4, 33, 130, 3, True, (1,), False, 0.8),
    "T0-H16-L3-S2": (0, 16, 3, 2, True, (2,), True, 1.0),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_read_and_gradients_match_float64(implementation, case, dtype):
    tokens, hidden, count, queries, key_weighted, gain_rows, normalize, scale = case
    sources = [s.requires_grad_() for s in make_sources(tokens, hidden, count, dtype, tiny_rows=True)]
    query, key, gain = (t if t is None else t.requires_grad_() for t in parameters(hidden, queries, key_weighted,
                                                                                    gain_rows))
    out, weights = attnres_ge.fused_attnres(query, sources, key, gain, 1e-6, scale, True, normalize_values=normalize)
    leaves = [t.detach().double().requires_grad_() for t in (*sources, query)]
    extra = [None if t is None else t.detach().double().requires_grad_() for t in (key, gain)]
    expected, expected_weights = general_read_reference(leaves[-1], leaves[:-1], *extra, 1e-6, scale, normalize, True)
    if queries == 1:
        expected, expected_weights = expected[0], expected_weights[0]
    assert out.dtype == dtype and weights.dtype == torch.float32
    assert_within("output", out, expected, dtype)
    assert_within("weights", weights, expected_weights, torch.float32)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    out.backward(grad)
    expected.backward(grad.double())
    inputs = [*sources, query, key, gain]
    references = [*leaves, *extra]
    for index, (tensor, reference) in enumerate(zip(inputs, references, strict=True)):
        if tensor is not None:
            assert tensor.grad.dtype == tensor.dtype
            assert_within(f"gradient of input {index}", tensor.grad, reference.grad,
                          dtype if index < count else torch.float32, whole_tensor=True)


def test_output_norm_has_its_own_eps(implementation):
    sources = make_sources(5, 24, 3, torch.float32, tiny_rows=True)
    query, key, gain = parameters(24, 2, True, (2,))
    out = attnres_ge.fused_attnres(query, [0.01 * s for s in sources], key, gain, 1e-6, output_rms_eps=1e-2)
    expected = general_read_reference(query, [0.01 * s for s in sources], key, gain, 1e-6, output_eps=1e-2)
    assert_within("output", out, expected, torch.float32)
    same_eps = general_read_reference(query, [0.01 * s for s in sources], key, gain, 1e-6)
    assert max_violation(out, same_eps, torch.float32)[1] > 0  # the eps is visible at these magnitudes


def test_sources_are_read_where_they_lie(implementation):
    """Views with a row stride (the rows of one [T, N, H] tensor) give what contiguous copies give."""
    stacked = torch.randn(6, 4, 24)
    query, key, gain = parameters(24, 2, True, (2,))
    views = list(stacked.unbind(1))
    copies = [view.contiguous() for view in views]
    assert all(not view.is_contiguous() for view in views)
    torch.testing.assert_close(attnres_ge.fused_attnres(query, views, key, gain),
                               attnres_ge.fused_attnres(query, copies, key, gain), rtol=0, atol=0)


@pytest.mark.parametrize("query_shape", [(24,), (1, 24), (24, 1)])
def test_one_query_gives_fla_shapes(query_shape):
    sources = make_sources(2 * 3, 24, 4, torch.float32)
    batched = [source.reshape(2, 3, 24) for source in sources]
    query = torch.randn(24).reshape(query_shape)
    out, weights = attnres_ge.fused_attnres(query, batched, torch.ones(24), return_weights=True)
    assert out.shape == (2, 3, 24) and weights.shape == (4, 2, 3)
    several, several_weights = attnres_ge.fused_attnres(torch.stack([query.reshape(24)] * 2), batched,
                                                        torch.ones(24), return_weights=True)
    assert several.shape == (2, 2, 3, 24) and several_weights.shape == (2, 4, 2, 3)
    torch.testing.assert_close(several[1], out, rtol=0, atol=0)


def test_opcheck():
    sources = make_sources(5, 16, 3, torch.float32)
    query, key, gain = parameters(16, 2, True, (2,))
    read = torch.ops.attnres.block_attn_res_read.default
    kwargs = {"scale": 0.5, "normalize_values": True, "save_statistics": True}
    torch.library.opcheck(read, ([s.requires_grad_() for s in sources], query.requires_grad_(), key, gain), kwargs)
    _, inv_norm, probs, inv_rms = read(sources, query, key, gain, **kwargs)
    backward = torch.ops.attnres.block_attn_res_read_backward.default
    torch.library.opcheck(backward, (torch.randn(2, 5, 16), [s.detach() for s in sources], query.detach(), inv_norm,
                                     probs, inv_rms, key, gain), {"scale": 0.5, "normalize_values": True})


BAD_INPUTS = {  # id: (arguments of fused_attnres, the words the error must hold)
    "empty-list": (lambda s, q: (q, [], None), "non-empty list"),
    "mixed-dtypes": (lambda s, q: (q, [s[0], s[1].half()], None), "residuals[1]"),
    "mixed-shapes": (lambda s, q: (q, [s[0], s[1][:2]], None), "residuals[1]"),
    "query-width": (lambda s, q: (torch.randn(2, 7), s, None), "query must be"),
    "key-weight-width": (lambda s, q: (q, s, torch.ones(7)), "key_norm_weight"),
    "gain-rows": (lambda s, q: (torch.randn(3, 16), s, None, torch.ones(2, 16)), "output_norm_weight"),
    "integer-sources": (lambda s, q: (q, [x.int() for x in s], None), "sources[0] must have dtype"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_named(case):
    arguments, words = case
    sources = make_sources(3, 16, 2, torch.float32)
    with pytest.raises((ValueError, AttnResInputError), match=re.escape(words)):
        attnres_ge.fused_attnres(*arguments(sources, torch.randn(16)))


@pytest.mark.parametrize("attrs, words", [({"eps": 0.0}, "eps"), ({"output_eps": -1.0}, "output_eps"),
                                          ({"scale": float("inf")}, "scale")])
def test_bad_attributes_are_named(attrs, words):
    with pytest.raises(AttnResInputError, match=f"BlockAttnResRead .*{words}"):
        torch.ops.attnres.block_attn_res_read(make_sources(3, 16, 2, torch.float32), torch.randn(1, 16), **attrs)


def test_gradient_needs_the_statistics():
    sources = [s.requires_grad_() for s in make_sources(3, 16, 2, torch.float32)]
    out = torch.ops.attnres.block_attn_res_read(sources, torch.randn(1, 16))[0]
    with pytest.raises(AttnResInputError, match="save_statistics"):
        out.sum().backward()


def test_weights_are_returned_without_derivative():
    """Like torch.sort's indices: the weights carry no autograd history, so a loss on them alone says so."""
    sources = [s.requires_grad_() for s in make_sources(3, 16, 2, torch.float32)]
    out, weights = attnres_ge.fused_attnres(torch.randn(16), sources, None, return_weights=True)
    assert out.requires_grad and not weights.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        weights.sum().backward()


def test_a_remembered_validation_still_refuses_other_inputs():
    """Eager calls keep their validation per input signature: a call differing in a dtype, a shape, the list's
    length or an attribute is validated afresh."""
    sources = make_sources(3, 16, 2, torch.float32)
    torch.ops.attnres.block_attn_res_read(sources, torch.randn(1, 16))
    with pytest.raises(AttnResInputError, match="sources\\[1\\]"):
        torch.ops.attnres.block_attn_res_read([sources[0], sources[1].half()], torch.randn(1, 16))
    with pytest.raises(AttnResInputError, match="sources\\[2\\]"):
        torch.ops.attnres.block_attn_res_read([*sources, sources[0][:2]], torch.randn(1, 16))
    with pytest.raises(AttnResInputError, match="eps"):
        torch.ops.attnres.block_attn_res_read(sources, torch.randn(1, 16), eps=0.0)
