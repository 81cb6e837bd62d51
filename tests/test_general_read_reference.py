"""The general read's float64 reference (op_kernel/reference.py) against the peers' own code.

The peers, run on the same inputs:
- FLA's `naive_attnres` (fla-core, fla/ops/attnres/naive.py): one query, a key-norm weight, raw values,
  an optional output RMSNorm; loaded from its file, so that the `fla` package (which imports Triton)
  is never imported. Several queries are several calls.
- transformers' `Inkling2BlockAttentionResidual` (models/inkling2/modeling_inkling2.py), built from a
  tiny config: 1 or 3 queries, unweighted key norm, normalised values, logits scaled by H**-0.5; the
  output norms are the Inkling2RMSNorm modules its decoder layers apply to each of its outputs.

Both peers compute in float32 whatever their inputs, by calling Tensor.float() (FLA naive.py lines
65-68 and 73; Inkling2 lines 127, 888 and 893). `float32_math_in_float64` makes that call return float64
while a peer runs, so that their formulas, unchanged, are compared with the reference at float64
rounding: FLOAT64_TOL, 1e-12 relative to the output's largest magnitude, about 1000 times the largest
difference measured (6e-16; the longest chains are the L-term softmax sum and the H-term dot products)
and 1e5 times below what float32 arithmetic anywhere in a peer would leave (1e-7): a peer still
computing in float32 fails it. Inkling2's eager attention takes its softmax in float32 explicitly, so
the float64 tier runs Inkling2 on its sdpa path; eager and sdpa both run as shipped, in float32, against
FLOAT32_TOL (1e-5 of the largest magnitude; measured 4e-7).

The Makefile installs the peers (pyproject.toml's `models` extra, and fla-core with --no-deps). Without
them these tests are skipped, except under CI (env CI set), where they fail.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
import torch

from attnres_ge.op_kernel.reference import general_read_reference

HIDDEN = 37
FLOAT64_TOL = 1e-12
FLOAT32_TOL = 1e-5


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(reason: str):
    if _in_ci():
        pytest.fail(f"{reason}; CI must run these comparisons (make setup installs the peers)")
    pytest.skip(f"{reason} (make setup installs it)")


@pytest.fixture(scope="module")
def naive_attnres():
    """FLA's naive_attnres, from fla/ops/attnres/naive.py of the installed fla-core, without importing fla."""
    spec = importlib.util.find_spec("fla")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        _missing("fla-core is not installed")
    path = Path(spec.submodule_search_locations[0]) / "ops" / "attnres" / "naive.py"
    if not path.is_file():
        _missing(f"the installed fla-core has no {path}")
    module_spec = importlib.util.spec_from_file_location("_fla_attnres_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ImportError as error:  # einops
        _missing(f"{path} does not import: {error}")
    return module.naive_attnres


@pytest.fixture(scope="module")
def inkling2() -> ModuleType:
    """transformers.models.inkling2.modeling_inkling2."""
    try:
        from transformers.models.inkling2 import modeling_inkling2
    except ImportError as error:
        _missing(f"transformers with Inkling2 (>= 5.25) is not importable: {error}")
    return modeling_inkling2


@contextmanager
def float32_math_in_float64() -> Iterator[None]:
    """Tensor.float() returns float64 inside: the peers' float32 compute dtype becomes float64."""
    assert "float" not in torch.Tensor.__dict__, "Tensor.float is already replaced"
    torch.Tensor.float = torch.Tensor.double
    try:
        yield
    finally:
        del torch.Tensor.float


def make_inputs(lead: tuple[int, ...], sources: int, queries: int, *, seed: int, query_std: float = 0.3):
    """(query [S, H], sources: L tensors [*lead, H]), float64. Each row's RMS is drawn from 1e-4..10, so
    that on the smallest rows eps (1e-6) outweighs mean(v^2) (down to 1e-8)."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(*shape):
        return torch.rand(*shape, generator=generator, dtype=torch.float64)

    rows = [torch.randn(*lead, HIDDEN, generator=generator, dtype=torch.float64) * 10 ** (5 * uniform(*lead, 1) - 4)
            for _ in range(sources)]
    query = torch.randn(queries, HIDDEN, generator=generator, dtype=torch.float64) * query_std
    return query, rows


def weight(seed: int, *shape: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 0.5 + torch.rand(*shape, HIDDEN, generator=generator, dtype=torch.float64)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float):
    """|actual - expected| <= tol * (|expected| + max |expected|), elementwise, with the same shape."""
    scale = expected.double().abs().max().item()
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol * scale)


# ------------------------------------------------------------------------------------------------ FLA

def fla_read(naive_attnres, query, sources, key_weight, output_weight, eps, scale):
    """naive_attnres once per query: (o [S, ..., H], p [S, L, ...])."""
    key_weight = torch.ones(HIDDEN, dtype=query.dtype) if key_weight is None else key_weight
    results = [naive_attnres(q, sources, key_weight, output_weight, eps, scale, True) for q in query]
    return torch.stack([o for o, _ in results]), torch.stack([p for _, p in results])


FLA_CASES = {  # id: (lead dims, L, S, key-norm weight, output-norm weight, scale)
    "one-token-L1": ((), 1, 1, True, False, 1.0),
    "T5-L2-unweighted-outnorm": ((5,), 2, 2, False, True, 1.0),
    "B2T5-L130-S3-both-weights": ((2, 5), 130, 3, True, True, 1.3),
    "B2T5-L130-S3-plain": ((2, 5), 130, 3, False, False, 0.7),
    "B3x1T5-L7-S2-outnorm": ((3, 1, 5), 7, 2, False, True, HIDDEN**-0.5),
}


@pytest.mark.parametrize("case", FLA_CASES.values(), ids=FLA_CASES.keys())
def test_fla_naive_attnres_float64(naive_attnres, case):
    lead, sources, queries, weighted, normed, scale = case
    query, rows = make_inputs(lead, sources, queries, seed=sources + queries)
    key_weight = weight(1) if weighted else None
    output_weight = weight(2) if normed else None
    with float32_math_in_float64():
        out, probs = fla_read(naive_attnres, query, rows, key_weight, output_weight, 1e-6, scale)
    expected, expected_probs = general_read_reference(query, rows, key_weight, output_weight, 1e-6, scale,
                                                      return_weights=True)
    assert out.dtype == probs.dtype == torch.float64
    assert out.shape == (queries, *lead, HIDDEN) and probs.shape == (queries, sources, *lead)
    assert_close(out, expected, FLOAT64_TOL)
    assert_close(probs, expected_probs, FLOAT64_TOL)


def test_fla_naive_attnres_as_shipped_float32(naive_attnres):
    """Unchanged, on float32 inputs: computed in float32, o rounded to the sources' dtype, p float32."""
    query, rows = make_inputs((2, 5), 130, 3, seed=7)
    query, rows = query.float(), [row.float() for row in rows]
    key_weight, output_weight = weight(1).float(), weight(2).float()
    out, probs = fla_read(naive_attnres, query, rows, key_weight, output_weight, 1e-6, 1.3)
    expected, expected_probs = general_read_reference(query, rows, key_weight, output_weight, 1e-6, 1.3,
                                                      return_weights=True)
    assert out.dtype == probs.dtype == torch.float32
    assert_close(out, expected, FLOAT32_TOL)
    assert_close(probs, expected_probs, FLOAT32_TOL)


@pytest.mark.parametrize("change", ["scale", "eps", "normalize_values", "no_output_norm", "no_key_weight"])
def test_fla_comparison_catches(naive_attnres, change):
    """A reference called with one thing wrong fails the float64 comparison."""
    query, rows = make_inputs((2, 5), 130, 2, seed=3)
    key_weight, output_weight = weight(1), weight(2)
    with float32_math_in_float64():
        out, _ = fla_read(naive_attnres, query, rows, key_weight, output_weight, 1e-6, 1.3)
    arguments = dict(key_norm_weight=key_weight, output_norm_weight=output_weight, eps=1e-6, scale=1.3)
    assert_close(out, general_read_reference(query, rows, **arguments), FLOAT64_TOL)
    wrong = {"scale": dict(scale=1.3 * (1 + 1e-6)), "eps": dict(eps=2e-6),
             "normalize_values": dict(normalize_values=True), "no_output_norm": dict(output_norm_weight=None),
             "no_key_weight": dict(key_norm_weight=None)}[change]
    with pytest.raises(AssertionError):
        assert_close(out, general_read_reference(query, rows, **{**arguments, **wrong}), FLOAT64_TOL)


# -------------------------------------------------------------------------------------------- Inkling2

def inkling2_read(inkling2, query, rows, attention: str, output_norms=None):
    """Inkling2BlockAttentionResidual with `query` ([S, H]) over `rows` (the N blocks, then the partial block;
    each [B, T, H]), then output_norms[s] (an Inkling2RMSNorm) on output s when given: [S, B, T, H]."""
    config = inkling2.Inkling2TextConfig(hidden_size=HIDDEN)
    config._attn_implementation = attention
    module = inkling2.Inkling2BlockAttentionResidual(config, num_queries=query.shape[0])
    module.query.data = query.reshape(module.query.shape).clone()
    partial = rows[-1]
    blocks = torch.stack(rows[:-1], dim=-2) if len(rows) > 1 else partial.new_zeros(*partial.shape[:-1], 0, HIDDEN)
    with torch.no_grad():
        outputs = module(blocks, partial)
        if output_norms is not None:
            outputs = [norm(output) for norm, output in zip(output_norms, outputs, strict=True)]
    return torch.stack(outputs)


def inkling2_reference(query, rows, **arguments):
    return general_read_reference(query, rows, scale=HIDDEN**-0.5, normalize_values=True, **arguments)


@pytest.mark.parametrize("sources", [1, 2, 130])
@pytest.mark.parametrize("queries", [1, 3])
def test_inkling2_float64(inkling2, queries, sources):
    query, rows = make_inputs((2, 5), sources, queries, seed=10 * queries + sources, query_std=1.0)
    with float32_math_in_float64():
        out = inkling2_read(inkling2, query, rows, "sdpa")
    assert out.dtype == torch.float64 and out.shape == (queries, 2, 5, HIDDEN)
    assert_close(out, inkling2_reference(query, rows), FLOAT64_TOL)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_inkling2_as_shipped_float32(inkling2, attention):
    """Unchanged, on float32 inputs, with a decoder layer's output norms (one weight per query, as the
    q/k/v_input_layernorm of Inkling2FullDecoderLayer): float32 throughout."""
    query, rows = make_inputs((2, 5), 130, 3, seed=5, query_std=1.0)
    query, rows = query.float(), [row.float() for row in rows]
    gains = weight(4, 3).float()
    norms = [inkling2.Inkling2RMSNorm(HIDDEN, eps=1e-6) for _ in range(3)]
    for norm, gain in zip(norms, gains, strict=True):
        norm.weight.data = gain.clone()
    out = inkling2_read(inkling2, query, rows, attention, norms)
    assert out.dtype == torch.float32
    assert_close(out, inkling2_reference(query, rows, output_norm_weight=gains), FLOAT32_TOL)


@pytest.mark.parametrize("change", ["scale", "eps", "raw_values", "key_weight"])
def test_inkling2_comparison_catches(inkling2, change):
    """A reference called with one thing wrong fails the float64 comparison."""
    query, rows = make_inputs((2, 5), 130, 3, seed=11, query_std=1.0)
    with float32_math_in_float64():
        out = inkling2_read(inkling2, query, rows, "sdpa")
    arguments = dict(scale=HIDDEN**-0.5, normalize_values=True, eps=1e-6)
    assert_close(out, general_read_reference(query, rows, **arguments), FLOAT64_TOL)
    wrong = {"scale": dict(scale=HIDDEN**-0.5 * (1 + 1e-6)), "eps": dict(eps=2e-6),
             "raw_values": dict(normalize_values=False), "key_weight": dict(key_norm_weight=weight(1))}[change]
    with pytest.raises(AssertionError):
        assert_close(out, general_read_reference(query, rows, **{**arguments, **wrong}), FLOAT64_TOL)


# ------------------------------------------------------------------------------------ the reference alone

def test_reference_shapes_and_checks():
    query, rows = make_inputs((4,), 3, 2, seed=0)
    out, probs = general_read_reference(query, rows, return_weights=True)
    assert out.shape == (2, 4, HIDDEN) and probs.shape == (2, 3, 4) and out.dtype == probs.dtype == torch.float64
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(2, 4, dtype=torch.float64))
    # One output-norm weight for all queries is the same as that weight given per query.
    gain = weight(1)
    torch.testing.assert_close(general_read_reference(query, rows, output_norm_weight=gain),
                               general_read_reference(query, rows, output_norm_weight=gain.expand(2, -1)))
    for bad_query, bad_rows in ((query[0], rows), (query, []), (query, [rows[0], rows[1][:2]]),
                                (query[:, :-1], rows)):
        with pytest.raises(ValueError):
            general_read_reference(bad_query, bad_rows)
