"""The llvm-mca loop model (tools/loop_model.py, a development tool): it finds the kernels' hot loops in the
assembly the build would produce, along their common path, and llvm-mca's report is read. The compiled checks
take the `avx2` translation unit only (about 15 s on an idle core: 10 to compile, 4 to read) and need g++ and
llvm-mca, not an AVX2 host: nothing runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import platform
import shutil
import sys
import textwrap
from pathlib import Path

import pytest


def _load_loop_model():
    """The tool of this checkout (it reads this checkout's C++ sources); tools/ is no package, so by its path."""
    path = Path(__file__).resolve().parents[1] / "tools" / "loop_model.py"
    spec = importlib.util.spec_from_file_location("attnres_loop_model_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


loop_model = _load_loop_model()
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _loops_from(text: str, tmp_path) -> list:
    path = tmp_path / "loop.s"
    path.write_text(textwrap.dedent(text))
    return loop_model.hot_cycles(loop_model.read_functions(path))


def test_trace_keeps_the_common_path(tmp_path):
    """A NaN check (a vector mask tested, branching to code placed after the loop, which jumps back) and an
    optional prefetch: the trip round the loop skips the NaN code and takes the prefetch or not."""
    loops = _loops_from(
        """
        f:
        .L2:
        \tvmovups\t(%rdi,%rax), %ymm0
        \ttestq\t%rsi, %rsi
        \tje\t.L3
        \tprefetcht1\t(%rsi,%rax)
        .L3:
        \tvcmpps\t$3, %ymm0, %ymm0, %ymm1
        \tvmovmskps\t%ymm1, %ecx
        \ttestl\t%ecx, %ecx
        \tjne\t.L5
        .L4:
        \tvmovups\t%ymm0, (%rdx,%rax)
        \taddq\t$32, %rax
        \tcmpq\t%rax, %r8
        \tjne\t.L2
        \tret
        .L5:
        \tvblendvps\t%ymm1, %ymm2, %ymm0, %ymm0
        \tjmp\t.L4
        """,
        tmp_path,
    )
    trips = {loop.prefetching: [i.text.split()[0] for i in loop.instructions] for loop in loops}
    assert set(trips) == {True, False}
    for prefetching, mnemonics in trips.items():
        assert "vblendvps" not in mnemonics
        assert ("prefetcht1" in mnemonics) == prefetching
        assert mnemonics[-1] == "jne" and mnemonics.count("vmovups") == 2


def test_trace_of_an_outer_loop_stays_in_its_inner_loop(tmp_path):
    loops = _loops_from(
        """
        g:
        .L1:
        \txorl\t%eax, %eax
        .L2:
        \tvaddps\t(%rdi,%rax), %ymm0, %ymm0
        \taddq\t$32, %rax
        \tcmpq\t%rax, %rsi
        \tjne\t.L2
        \taddq\t$1, %rcx
        \tcmpq\t%rcx, %rdx
        \tjne\t.L1
        \tret
        """,
        tmp_path,
    )
    assert {tuple(i.text.split()[0] for i in loop.instructions) for loop in loops} == {
        ("vaddps", "addq", "cmpq", "jne")
    }


def test_mca_report_is_read():
    report = textwrap.dedent(
        """\
        Iterations:        100
        Instructions:      300
        Total Cycles:      250
        Total uOps:        300

        Dispatch Width:    4
        uOps Per Cycle:    1.20
        IPC:               1.20
        Block RThroughput: 2.0


        Instruction Info:
        [1]: #uOps
        [2]: Latency
        [3]: RThroughput
        [4]: MayLoad
        [5]: MayStore
        [6]: HasSideEffects (U)

        [1]    [2]    [3]    [4]    [5]    [6]    Instructions:
         1      8     0.50    *                   vmovups\t(%rdi), %ymm0
         1      100   0.25                        vcvtph2ps\t%xmm3, %ymm3
         2      507   0.50           *            vmovntdq\t%ymm1, (%r13)
         1      1     0.25                        addq\t$32, %rax


        Resources:
        [0]   - PortA
        [1]   - PortB


        Resource pressure per iteration:
        [0]    [1]
        2.40   0.60

        Resource pressure by instruction:
        [0]    [1]    Instructions:
        1.90   -      vmovups\t(%rdi), %ymm0
        0.50   0.10   vcvtph2ps\t%xmm3, %ymm3
         -     0.50   addq\t$32, %rax
        """
    )
    model = loop_model.parse_mca(report)
    assert model.cycles_per_iteration == 2.5
    assert model.bound == "PortA 2.4/2.5"
    assert model.top_instructions[0] == ("vmovups", 1.9)
    # a placeholder (no data) and LLVM 19 sapphirerapids' streaming store, which llvm-mca waits for
    assert model.unmodelled == ["vcvtph2ps", "vmovntdq"]


def test_bytes_per_element():
    assert loop_model.bytes_per_element("forward", "float32", 9) == pytest.approx(4 * 10 / 9)
    assert loop_model.bytes_per_element("backward", "bfloat16", 9) == pytest.approx(2 * 19 / 9)
    assert loop_model.memory_cycles_per_element("forward", "bfloat16", 9, 3.0, 8.0) == pytest.approx(2 * 10 / 9 * 3 / 8)


needs_tools = pytest.mark.skipif(
    not X86 or shutil.which("g++") is None or shutil.which("llvm-mca") is None,
    reason="needs an x86-64 host with g++ and llvm-mca (Debian: apt-get install g++ llvm); "
    "the host's own instruction set does not matter",
)


# The model covers the other ops' loops, not the read's: its kernels are left out of the translation unit
# (block_attn_res_read_args.h), which cuts its compile time by about 40% and leaves the modelled loops' code as
# it is (checked once: the same 16 loops, instruction for instruction, up to label numbers).
WITHOUT_READ_KERNELS = ("ATTNRES_TEST_WITHOUT_READ_KERNELS",)


@pytest.fixture(scope="module")
def avx2_rows(tmp_path_factory):
    assembly = loop_model.compile_to_assembly("avx2", tmp_path_factory.mktemp("loop-model"),
                                              defines=WITHOUT_READ_KERNELS)
    return {(r.op, r.dtype, r.spec.name): r for r in loop_model.hot_loops("avx2", assembly)}


def _mnemonics(row) -> list[str]:
    return [i.text.split()[0] for i in row.loop.instructions]


@pytest.mark.slow
@needs_tools
def test_avx2_hot_loops_are_found(avx2_rows):
    missing = [key for key, row in avx2_rows.items() if row.loop is None]
    assert not missing, f"no hot loop found for {missing}"
    assert len(avx2_rows) == 16  # 6 loops per op: float32's, each 16-bit type's with its run end
    # Pass 1 of float32: three rows (9 = 3 + 3 + 3) widened to float64 lanes, each row prefetched.
    forward_f32 = _mnemonics(avx2_rows["forward", "float32", "dot_lanes_k"])
    assert forward_f32.count("prefetcht1") == 3 and forward_f32.count("vcvtps2pd") == 12
    assert any(m.startswith("vfmadd") and m.endswith("pd") for m in forward_f32)
    # The 16-bit runs: three rows (avx2's kRunRows; 9 = 3 + 3 + 3) of float32 fused multiply-adds, two groups
    # (a line) a step, each row's line prefetched once, no float64 inside the loop; at their end the widening,
    # once per run.
    runs = _mnemonics(avx2_rows["forward", "bfloat16", "add_runs"])
    assert runs.count("prefetcht1") == 3 and "vcvtps2pd" not in runs
    assert sum(m.startswith("vfmadd") and m.endswith("ps") for m in runs) == 3 * 2 * 2 * 2
    run_end = _mnemonics(avx2_rows["forward", "bfloat16", loop_model.RUN_END_NAME])
    assert run_end.count("vcvtps2pd") == 3 * 2 * 4
    # Pass 2 of the bfloat16 backward: streaming stores of rounded words, for finite inputs without a NaN check
    # (kBf16NumberStores).
    grads = _mnemonics(avx2_rows["backward", "bfloat16", "grad_rows"])
    assert grads.count("vmovntdq") == 4 and "vpblendw" in grads
    assert "vblendvps" not in grads and "vmovmskps" not in grads
    assert "prefetcht0" not in grads  # rows past the first pair
    assert _mnemonics(avx2_rows["forward", "float32", "weighted_sum_groups"]).count("prefetcht1") == 4


@pytest.mark.slow
@needs_tools
def test_avx2_loop_is_modelled(avx2_rows):
    row = avx2_rows["forward", "bfloat16", "add_runs"]
    model = loop_model.run_mca(row.loop, "znver2")
    assert 0 < model.cycles_per_iteration < 1000
    assert model.bound != "?" and model.top_instructions


@pytest.mark.slow
@needs_tools
def test_tables_show_a_cpu_asked_for_beyond_the_paths_usual_ones(avx2_rows):
    row = avx2_rows["forward", "bfloat16", "add_runs"]
    asked = "skylake-avx512"  # an llvm-mca model of the 512-bit paths, not one of avx2's columns
    assert asked not in loop_model.CPUS_FOR_PATH["avx2"]
    modelled = dataclasses.replace(row, models={"znver2": loop_model.run_mca(row.loop, "znver2"),
                                                asked: loop_model.run_mca(row.loop, asked)})
    out = io.StringIO()
    loop_model.print_tables({"avx2": [modelled]}, 9, 3.0, 8.0, out=out)
    header = next(line for line in out.getvalue().splitlines() if line.startswith("| op | dtype | loop"))
    assert header.rstrip(" |").endswith(f"znver2 | {asked}")
    cycles = modelled.cycles_per_element(asked, 9)
    assert f"| {cycles:.2f} |" in out.getvalue()
