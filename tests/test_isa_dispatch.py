"""The native kernels' instruction set paths (op_kernel/csrc/dispatch.h): every path this host can
run gives the same bits, ATTNRES_GE_ISA forces one, and the baseline code holds no vector
instruction of a path the CPU may lack."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import KERNELS_BY_TYPE, assert_bitwise_equal, assert_same_bits_but_nan_payloads, make_inputs

from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile
from attnres_ge.op_kernel import kernel

native = pytest.importorskip("attnres_ge.op_kernel.native", reason="the native kernels are not built")
NATIVE = {op_type: kernel(op, "native") for op_type, op in KERNELS_BY_TYPE.items()}
FORWARD_NAMES = ("hidden_states", "inv_norm", "probs")
BACKWARD_NAMES = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def run_both(inputs, grad_hidden, cores, ub_size):
    """Forward outputs and backward outputs (from the forward's statistics) on the current path."""
    partial, blocks, proj, norm = inputs
    tokens, count, hidden = blocks.shape
    platform = PlatformInfo(PlatformProfile("test", cores, ub_size))
    forward = forward_tiling.tiling(forward_tiling.parse(platform), tokens, count, hidden, partial.dtype, 1e-6, True,
                                    platform)
    outputs = (torch.empty_like(partial), torch.empty(tokens, count + 1), torch.empty(tokens, count + 1))
    NATIVE["BlockAttentionResiduals"](*inputs, *outputs, torch.empty(0, dtype=torch.uint8), forward.data)
    backward = grad_tiling.tiling(grad_tiling.parse(platform), tokens, count, hidden, partial.dtype, platform)
    grads = tuple(torch.empty_like(t) for t in inputs)
    workspace = torch.empty(backward.workspace_size, dtype=torch.uint8)
    NATIVE["BlockAttentionResidualsGrad"](*inputs, grad_hidden, outputs[1], outputs[2], *grads, workspace,
                                          backward.data)
    return dict(zip(FORWARD_NAMES + BACKWARD_NAMES, outputs + grads, strict=True))


def assert_paths_agree(inputs, grad_hidden, cores, ub_size, same=assert_bitwise_equal):
    results = {}
    for path in native.available_isa_paths():
        native.use_isa_path(path)
        results[path] = run_both(inputs, grad_hidden, cores, ub_size)
    scalar = results.pop("scalar")
    for path, result in results.items():
        for name, value in result.items():
            same(f"{path} vs scalar: {name}", value, scalar[name])


# (T, N, H, cores, buffer bytes): H off the 16-lane grid, H = 1, split-H tiles (small buffers),
# several cores and partial chunks.
# N+1 from 2 to 17 rows: the kernels read rows in groups whose sizes depend on N (kernel_loops.h).
# The backward's bfloat16 hidden tiles: whole 64-byte lines (250 in 96 + 96 + 58: its split lines,
# backward_kernel.h), other sizes (1000, 300, 200) and one tile (37, 64).
SHAPES = [(7, 3, 37, 2, 1 << 20), (33, 5, 1000, 3, 4096), (130, 8, 64, 4, 8192), (5, 2, 1, 2, 1 << 20),
          (66, 1, 17, 5, 4096), (40, 4, 300, 3, 8192), (12, 16, 200, 3, 4096), (20, 4, 250, 3, 6144)]


@pytest.mark.parametrize("dtype_id", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-N{}-H{}-c{}-ub{}".format(*s))
def test_every_path_gives_the_same_bits(shape, dtype_id, restore_isa_path):
    tokens, blocks, hidden, cores, ub_size = shape
    dtype = DTYPES[dtype_id]
    inputs = make_inputs(tokens, blocks, hidden, dtype, seed=tokens + hidden)
    grad_hidden = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3)).to(dtype)
    assert_paths_agree(inputs, grad_hidden, cores, ub_size)


def test_the_shapes_hold_backward_tiles_of_whole_lines_and_of_other_sizes():
    """The 512-bit bfloat16 backward keeps pass 2's rows in split lines only when every hidden tile is of
    whole 64-byte lines (32 elements): the shapes above must hold several such tiles, and tiles of other
    sizes, or the bit comparison would not cover both layouts."""
    kinds = set()
    for tokens, blocks, hidden, cores, ub_size in SHAPES:
        platform = PlatformInfo(PlatformProfile("test", cores, ub_size))
        data = grad_tiling.tiling(grad_tiling.parse(platform), tokens, blocks, hidden, torch.bfloat16, platform).data
        if data.h_tile_num > 1:
            kinds.add("whole lines" if data.h_tile % 32 == 0 else "other sizes")
    assert kinds == {"whole lines", "other sizes"}


@pytest.mark.parametrize("dtype_id", DTYPES)
def test_every_path_gives_the_same_bits_on_special_values(dtype_id, restore_isa_path):
    """Tokens whose values, outputs and gradients are subnormal, huge, zero, Inf or NaN: the
    conversions' edge cases (AVX512-BF16 flushes subnormals, keeps NaN payloads) must not show. H = 80:
    both kernels store 16-bit rows two groups at a time as well as one (the tail), and a pair holding
    one special group takes another conversion than its neighbour."""
    dtype = DTYPES[dtype_id]
    tokens, blocks, hidden = 12, 3, 80
    partial, block_res, proj, norm = (t.float() for t in make_inputs(tokens, blocks, hidden, dtype, seed=5))
    grad_hidden = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(9))
    tiny = torch.finfo(dtype).smallest_normal
    for t, scale in enumerate([tiny, tiny / 64, 1e30, 0.0]):  # subnormal-range values and outputs, huge, zeros
        partial[t] *= scale
        block_res[t] *= scale
    grad_hidden[4] *= tiny / 8  # subnormal gradients
    grad_hidden[5] *= 1e-40
    block_res[6, 1, 3] = float("inf")
    partial[7, 5] = float("nan")
    grad_hidden[8, 2] = float("nan")
    block_res[9, 0] = float("-inf")
    inputs = tuple(t.to(dtype) for t in (partial, block_res, proj, norm))
    assert_paths_agree(inputs, grad_hidden.to(dtype), 3, 4096, same=assert_same_bits_but_nan_payloads)


def test_the_default_path_is_the_fastest_the_cpu_has():
    code = "from attnres_ge.op_kernel import native; print(native.isa_path(), *native.available_isa_paths())"
    env = {key: value for key, value in os.environ.items() if key != native.ISA_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    chosen, *available = out.stdout.split()
    assert chosen == available[-1]


@pytest.mark.parametrize("path", ["scalar", "auto"])
def test_the_environment_variable_forces_a_path(path):
    code = "from attnres_ge.op_kernel import native; print(native.isa_path(), *native.available_isa_paths())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, native.ISA_ENV: path}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    chosen, *available = out.stdout.split()
    assert chosen == (available[-1] if path == "auto" else path)


def test_forcing_an_unknown_path_is_a_clear_error_at_import():
    out = subprocess.run([sys.executable, "-c", "import attnres_ge"], env={**os.environ, native.ISA_ENV: "avx9000"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "ATTNRES_GE_ISA=avx9000" in out.stderr and "cannot use instruction set path 'avx9000'" in out.stderr
    assert "this CPU runs scalar" in out.stderr


def test_a_path_the_cpu_lacks_is_refused(restore_isa_path, monkeypatch):
    monkeypatch.setattr(native._native, "available_isa_paths", lambda: ("scalar",))  # a CPU without vector units
    with pytest.raises(ValueError, match="cannot use instruction set path 'avx2': this CPU runs scalar"):
        native.use_isa_path("avx2")


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_only_the_vector_paths_hold_vector_instructions():
    """A function outside attnres::avx2/avx512/avx512bf16 runs on any CPU, so it must hold no AVX
    instruction (VEX/EVEX: v-prefixed mnemonics, ymm/zmm/mask registers). Library functions the
    vector paths share with the baseline (std::vector's, say) are the ones at risk."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", native._native.__file__],
                             capture_output=True, text=True, timeout=300, check=True).stdout
    # Demangled, or mangled where objdump cannot demangle a clone's name (some .isra clones of lambdas).
    vector_path = re.compile(r"attnres::(avx2|avx512|avx512bf16)::|^_ZN7attnres(4avx2|6avx512|10avx512bf16)")
    avx = re.compile(r"^v[a-z]|%[yz]mm|%k[0-7]")
    function, offenders, vector_functions = None, {}, 0
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            vector_functions += bool(vector_path.search(function))
            continue
        fields = line.split("\t")
        if function and len(fields) >= 2 and avx.search(fields[1].strip()) and not vector_path.search(function):
            offenders.setdefault(function, fields[1].strip())
    assert vector_functions > 0, "no vector-path functions found: the listing is not what this test expects"
    assert not offenders, f"AVX instructions outside the vector paths: {dict(list(offenders.items())[:5])}"


CSRC = Path(__file__).resolve().parent.parent / "op_kernel" / "csrc"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build tests/csrc/sse2_check.cpp")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the SSE2 lanes are x86's scalar path")
def test_the_scalar_paths_sse2_lanes_give_the_portable_lanes_bits(tmp_path):
    """The scalar path's SSE2 lanes (simd_sse2.h) against the portable ones (simd_scalar.h) bit for bit:
    vfma (float64 sums, the exact route at float32 midpoints and below the smallest normal) against the C
    library's fmaf on 4.7 million triples (random, nearly cancelling, landing on midpoints, near the
    subnormal and overflow limits, all special values), also under flush-to-zero and round-toward-zero
    (where it defers to fmaf); every other operation on random bit patterns."""
    program = tmp_path / "sse2_check"
    source = Path(__file__).resolve().parent / "csrc" / "sse2_check.cpp"
    subprocess.run(["g++", "-O2", "-ffp-contract=off", "-std=c++17", f"-I{CSRC}", str(source), "-o", str(program)],
                   check=True, capture_output=True, text=True)
    result = subprocess.run([str(program)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.endswith("0 differences\n"), result.stdout


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_scalar_path_compiles_with_the_portable_lanes(tmp_path):
    """What other architectures build as `scalar` (simd_scalar.h's lanes, which x86 builds only as
    sse2_check's reference) still compiles with the kernels: forced here by ATTNRES_PORTABLE_LANES."""
    result = subprocess.run(["g++", "-std=c++17", "-O0", "-c", "-DATTNRES_PORTABLE_LANES", f"-I{CSRC}",
                             str(CSRC / "isa_scalar.cpp"), "-o", str(tmp_path / "portable.o")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
