"""The bench's registry of named shapes: what it times (a family of cases, or a registry op), under which names.

NAMED_SHAPES maps each family the bench has its own case for (FAMILY_OPS: the ops it times) to its named shapes,
and may map a registry op of the generic "op" family (bench.cases.op) to its own; --shapes picks among all of
them, and a run without --shapes times DEFAULT_SHAPES where a family names them, else every named shape.

A shape is a tuple of sizes in its family's letters (FAMILY_LETTERS, docs/contract.md's letters); for a registry
op in the order its prototype's inputs first use them (op_letters). A registry op with `bench_inputs` and no
entry here gets one shape by this rule, named "<op>_T4096_H2048" for example: T (tokens) 4096, a prefill;
H and D (hidden) 2048, the per-layer op's goal shape; every other letter (a count: N, S, ...) 8. Named shapes
are unique across the registry, so --shapes needs no family to go with a name.
"""

from __future__ import annotations

# Sizes of the default shape of a registry op, by letter; any other letter is a count.
DEFAULT_SIZES = {"T": 4096, "H": 2048, "D": 2048}
DEFAULT_COUNT = 8
BLOCK_READS = 8

FAMILY_OPS: dict[str, tuple[str, ...]] = {
    "per-layer": ("block_attention_residuals", "block_attention_residuals_backward"),
    "two-phase": ("block_attn_res_prepare", "block_attn_res_update", "block_attn_res_update_norm"),
    "block": ("block_attention_residuals", "block_attn_res_prepare", "block_attn_res_update"),
    "stream": ("block_attention_residuals", "block_attn_res_prepare", "block_attn_res_update"),
    "read": ("block_attn_res_read",),
    "inkling2-model": ("block_attn_res_read",),
}
# inkling2-model: P tokens in the cache before the call, T tokens it feeds, D hidden, L layers, a seal every B.
FAMILY_LETTERS = {"per-layer": "TNH", "two-phase": "TNSD", "block": "TNDR", "stream": "TDLB", "read": "TNHS",
                  "inkling2-model": "PTDLB"}

NAMED_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "per-layer": {
        "T4096_N8_H2048": (4096, 8, 2048),
        "T1024_N16_H8192": (1024, 16, 8192),
        "T16_N8_H4096": (16, 8, 4096),  # decode-like: per-call overhead dominates
    },
    "two-phase": {
        "T4096_N8_S8_D2048": (4096, 8, 8, 2048),
        "T4096_N8_S8_D7168": (4096, 8, 8, 7168),
        "T16_N8_S8_D2048": (16, 8, 8, 2048),  # decode-like
    },
    # One block of a model (issue 23): prefill and decode token counts, R reads per block.
    "block": {
        f"block_T{tokens}_N{blocks}_D{hidden}_R{BLOCK_READS}": (tokens, blocks, hidden, BLOCK_READS)
        for tokens in (4096, 16, 1) for blocks in (8, 32) for hidden in (2048, 7168)
    },
    # One no-grad forward of a model's residual stream (its sublayers left out): a prefill and a decode token count.
    "stream": {f"stream_T{tokens}_D2048_L32_B4": (tokens, 2048, 32, 4) for tokens in (4096, 1)},
    # The general read (N blocks and the partial block, S queries): Inkling2's MLP input (S=1; FLA's interface
    # too) and a full-attention layer's q, k, v inputs (S=3).
    "read": {f"read_T4096_N8_H2048_S{queries}": (4096, 8, 2048, queries) for queries in (1, 3)},
    # A tiny Inkling2 model (cases/model.py), stock against patched: a 128-token prefill, then one decode step.
    "inkling2-model": {"inkling2_P0_T128_D256_L4_B1": (0, 128, 256, 4, 1),
                       "inkling2_P128_T1_D256_L4_B1": (128, 1, 256, 4, 1)},
}
# Timed without --shapes where fewer than every named shape (--all-blocks adds every block shape).
DEFAULT_SHAPES: dict[str, tuple[str, ...]] = {
    "block": ("block_T4096_N8_D2048_R8", "block_T16_N8_D2048_R8", "block_T1_N8_D2048_R8", "block_T1_N32_D7168_R8"),
}


def bespoke_ops() -> set[str]:
    """The torch ops timed by a family of their own, which the generic family leaves alone."""
    return {name for ops in FAMILY_OPS.values() for name in ops}


def registry_ops() -> list:
    """The op registry's entries as they are now (tests and plug-ins append to ops.OPS at run time)."""
    from attnres_ge.ge_plugin import ops

    return list(ops.OPS)


def generic_ops() -> dict[str, object]:
    """Torch op name -> registry entry, for every op the generic family times: `bench_inputs` set, no family."""
    bespoke = bespoke_ops()
    return {op.name: op for op in registry_ops() if op.bench_inputs is not None and op.name not in bespoke}


def op_letters(op) -> str:
    """The letters of an op's shape: those its prototype's inputs' layouts use, in order of first use."""
    return "".join(op.prototype.letters())


def op_shapes(op) -> dict[str, tuple[int, ...]]:
    """A registry op's named shapes: its NAMED_SHAPES entry, else the one default shape (module docstring)."""
    if op.name in NAMED_SHAPES:
        return NAMED_SHAPES[op.name]
    sizes = tuple(DEFAULT_SIZES.get(letter, DEFAULT_COUNT) for letter in op_letters(op))
    name = "_".join([op.name, *(f"{letter}{size}" for letter, size in zip(op_letters(op), sizes, strict=True))])
    return {name: sizes}


def all_shapes() -> dict[str, dict[str, tuple[int, ...]]]:
    """Every family's and generic op's named shapes; ValueError when a name is used twice."""
    shapes = {family: NAMED_SHAPES[family] for family in FAMILY_OPS}
    shapes.update((name, op_shapes(op)) for name, op in generic_ops().items())
    seen: dict[str, str] = {}
    for owner, named in shapes.items():
        for name in named:
            if name in seen:
                raise ValueError(f"bench: named shape {name!r} of {owner} is also one of {seen[name]}")
            seen[name] = owner
    return shapes


def defaults(owner: str, named: dict[str, tuple[int, ...]]) -> list[str]:
    """The names among `named` (the shapes of a family or generic op) timed without --shapes."""
    return list(DEFAULT_SHAPES.get(owner, named))


def listing() -> list[str]:
    """--list: one line per named shape (family or generic op, shape, sizes, default or not, ops timed), then
    one per registry op the bench cannot time (no family, no bench_inputs)."""
    generic = generic_ops()
    lines = []
    for owner, named in all_shapes().items():
        family, ops = (owner, FAMILY_OPS[owner]) if owner in FAMILY_OPS else ("op", (owner,))
        letters = FAMILY_LETTERS.get(owner) or op_letters(generic[owner])
        chosen = defaults(owner, named)
        for name, shape in named.items():
            sizes = " ".join(f"{letter}={size}" for letter, size in zip(letters, shape, strict=True))
            lines.append(f"{family:<14} {name:<28} {sizes:<28} {'default' if name in chosen else '':<8} "
                         f"{' '.join(ops)}")
    timed = bespoke_ops() | set(generic)
    lines += [f"{'untimed':<14} {op.name}: no family of its own and no bench_inputs"
              for op in registry_ops() if op.name not in timed]
    return lines
