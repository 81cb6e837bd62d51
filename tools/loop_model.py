"""Where the native kernels' cycles go, per CPU model: their hot inner loops through llvm-mca.

Compiles each instruction set path's translation unit (op_kernel/csrc/isa_*.cpp) to assembly with the
flags the build uses (setup.py's CXX_FLAGS after Python's CFLAGS, as torch's extension builder passes
them), finds the hot inner loops of both ops by the source line of their loop header (the assembly's
`.loc` line table; `-g` is among the build's flags, so the line table costs no change of code), and
runs llvm-mca on each loop body for several CPU models. It prints, per loop, the modelled cycles per
element (one element of one value row) and, per op, the sum of its passes beside the cycles per
element that the op's memory traffic takes at a given bandwidth per core and clock.

Nothing is timed: the figures are llvm-mca's model of a loop in steady state, with every load
hitting L1 (memory is accounted for separately, by the bandwidth figure). It runs on any x86-64 host
with g++ and llvm-mca (Debian: `apt-get install g++ llvm`), whatever that host's own instruction set.

    python3 tools/loop_model.py                          # every path, the default CPU models
    python3 tools/loop_model.py --paths avx2 --cpus znver1,skylake --views

A development tool: it needs the C++ sources, so it runs from a source checkout (it finds the checkout's
op_kernel/csrc and setup.py from its own place in tools/, whatever the current directory), and imports nothing
of the package; tools/ is not in the wheel.
docs/kernels.md ("Where the cycles go") holds its table and what it says.
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: this file is tools/loop_model.py
CSRC = ROOT / "op_kernel" / "csrc"
SETUP_PY = ROOT / "setup.py"

PATHS = ("scalar", "avx2", "avx512", "avx512bf16")
DTYPES = ("float32", "bfloat16", "float16")
SIXTEEN_BIT = ("bfloat16", "float16")
DTYPE_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# How the dtypes are spelled in the kernels' template arguments.
DTYPE_CXX = {"float32": "float", "bfloat16": "attnres::BF16", "float16": "attnres::FP16"}
AVX2_CPUS = ("znver1", "znver2", "znver3", "skylake", "icelake-server", "sapphirerapids")
# Not an llvm-mca model: znver1's figure with Zen 1's 256-bit split counted in (zen1_split), which LLVM 14's
# znver1 model leaves out (it issues a 256-bit FMA as one micro-op, two per cycle, as on Zen 2).
ZEN1_SPLIT = "zen1-split"
AVX512_CPUS = ("skylake-avx512", "icelake-server", "sapphirerapids")
WITH_SPLIT = AVX2_CPUS[:1] + (ZEN1_SPLIT,) + AVX2_CPUS[1:]
CPUS_FOR_PATH = {"scalar": WITH_SPLIT, "avx2": WITH_SPLIT, "avx512": AVX512_CPUS, "avx512bf16": AVX512_CPUS}
# llvm-mca's models that cannot run a path's instructions (no AVX512-BF16 before Cooper Lake).
UNSUPPORTED = {("avx512bf16", "skylake-avx512"), ("avx512bf16", "icelake-server")}

DEFAULT_ROWS = 9  # N + 1 at the benchmark shape T=4096, N=8, H=2048
DEFAULT_CLOCK_GHZ = 3.0
DEFAULT_BANDWIDTH_GBS = 8.0
ITERATIONS = 200


# ---------------------------------------------------------------------------
# Compiling.


def build_flags() -> list[str]:
    """The compile flags of the kernels' translation units, in the order the build passes them.

    Python's CFLAGS and CCSHARED come first (setuptools), then torch's C++ standard, then setup.py's
    CXX_FLAGS (read from setup.py, so that they cannot drift). Torch's extension builder also adds
    include paths and macro definitions that these translation units do not read.
    """
    python_flags = (sysconfig.get_config_var("CFLAGS") or "").split() + (
        sysconfig.get_config_var("CCSHARED") or ""
    ).split()
    return python_flags + ["-std=c++17"] + setup_cxx_flags()


def setup_cxx_flags() -> list[str]:
    """CXX_FLAGS of setup.py, read without running it."""
    tree = ast.parse(SETUP_PY.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CXX_FLAGS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"no CXX_FLAGS assignment in {SETUP_PY}")


def compile_to_assembly(path: str, out_dir: Path, compiler: str = "g++", defines: tuple[str, ...] = ()) -> Path:
    """op_kernel/csrc/isa_<path>.cpp as assembly, under out_dir; niced, one translation unit at a time.
    `defines`: macros defined on top of the build's flags (a test leaves the read's kernels out with one)."""
    source = CSRC / f"isa_{path}.cpp"
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing: the loop model needs a source checkout of attnres-ge")
    target = out_dir / f"isa_{path}.s"
    command = [compiler, *build_flags(), *(f"-D{name}" for name in defines), "-S", "-o", str(target), str(source)]
    if shutil.which("nice"):
        command = ["nice", *command]
    # GCC 12's -Wall warns about its own AVX-512 intrinsics (uninitialised __Y); the build sees those too.
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compiling {source.name} failed:\n{result.stderr[-4000:]}")
    return target


# ---------------------------------------------------------------------------
# Reading the assembly.


@dataclasses.dataclass
class Instruction:
    text: str
    file: str  # source file of its line-table entry ("" if none)
    line: int


@dataclasses.dataclass
class Loop:
    """One trip round an inner loop along its common path (see hot_cycles)."""

    function: str  # demangled
    label: str  # the label the trace started from
    instructions: list[Instruction]
    prefetching: bool  # whether the trace took the branches that prefetch
    items: list = dataclasses.field(repr=False, default_factory=list)  # the function's labels and instructions
    position: int = 0  # where in items the trace's first block starts

    def count(self, pattern: str) -> int:
        regex = re.compile(pattern)
        return sum(1 for i in self.instructions if regex.search(i.text))

    def lines(self) -> set[tuple[str, int]]:
        return {(i.file, i.line) for i in self.instructions}


_LABEL = re.compile(r"^([.\w$@]+):")
_FILE = re.compile(r'^\t\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')


def demangle(names: list[str]) -> list[str]:
    if not names or shutil.which("c++filt") is None:
        return names
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    out = result.stdout.split("\n")
    return out[: len(names)] if len(out) >= len(names) else names


@dataclasses.dataclass
class Block:
    labels: list[str]
    instructions: list[Instruction]
    successors: list[int]  # [taken target, fall-through] for a conditional branch; one otherwise; none: exit


def read_functions(assembly: Path) -> list[tuple[str, list]]:
    """(mangled name, [("label", name) | ("insn", Instruction)]) per function of the assembly, with every
    instruction's source line from the line table."""
    files: dict[int, str] = {}
    functions: list[tuple[str, list]] = []
    body: list | None = None
    file_line = ("", 0)
    with open(assembly) as stream:
        for raw in stream:
            if raw.startswith("\t.file"):
                match = _FILE.match(raw)
                if match:
                    files[int(match.group(1))] = Path(match.group(3) or match.group(2)).name
                continue
            if raw.startswith("\t.loc\t") or raw.startswith("\t.loc "):
                parts = raw.split()
                file_line = (files.get(int(parts[1]), ""), int(parts[2]))
                continue
            match = _LABEL.match(raw)
            if match:
                name = match.group(1)
                if not name.startswith(".L"):
                    body = []
                    functions.append((name, body))
                elif body is not None:
                    body.append(("label", name))
                continue
            if body is None or not raw.startswith("\t") or raw.startswith("\t."):
                continue
            text = raw.split("#")[0].strip()
            if text:
                body.append(("insn", Instruction(text, *file_line)))
    return functions


def basic_blocks(items: list) -> tuple[list[Block], dict[str, int], list[int]]:
    """The function's basic blocks, the block of each label, and where in items each block starts."""
    blocks: list[Block] = []
    starts: list[int] = []
    where: dict[str, int] = {}
    current: Block | None = None
    # Only labels that branches target start blocks (the debug information's .LVL/.LBB labels do not).
    targets = {v.text.split()[-1] for k, v in items if k == "insn" and v.text.startswith("j")}
    for position, (kind, value) in enumerate(items):
        if kind == "label":
            if value not in targets:
                continue
            if current is None or current.instructions:
                current = Block([], [], [])
                blocks.append(current)
                starts.append(position)
            current.labels.append(value)
            where[value] = len(blocks) - 1
            continue
        if current is None:
            current = Block([], [], [])
            blocks.append(current)
            starts.append(position)
        current.instructions.append(value)
        if value.text.startswith(("j", "ret")):
            current = None
    for index, block in enumerate(blocks):
        last = block.instructions[-1].text if block.instructions else ""
        target = last.split()[-1] if last.startswith("j") else ""
        if last.startswith("jmp"):
            block.successors = [where[target]] if target in where else []
        elif last.startswith("j"):
            block.successors = ([where[target]] if target in where else []) + [index + 1]
        elif not last.startswith("ret") and index + 1 < len(blocks):
            block.successors = [index + 1]
    return blocks, where, starts


def _reach(start: int, edges, stop: int | None = None) -> set[int]:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node == stop and node != start:
            continue
        for nxt in edges(node):
            if nxt not in seen:
                seen.add(nxt)
                if nxt != stop:
                    todo.append(nxt)
    return seen


_MASK_TEST = re.compile(r"^(v?p?movmsk|kortest|ktest|kmov|vptest|ptest)")
_PREFETCH = re.compile(r"^prefetch")


def _is_mask_test(block: Block) -> bool:
    """Whether the block ends by branching on a vector mask (the kernels' NaN and subnormal checks)."""
    return any(_MASK_TEST.match(i.text) for i in block.instructions[-4:])


def _all_clear_side(block: Block, jump: str) -> int | None:
    """For a branch on a NaN or subnormal check, the index in block.successors of the side taken when the check
    finds nothing: a vector mask tested for zero (je: taken, jne: not), or an unordered comparison's parity
    (jp: not taken, jnp: taken). None for any other branch."""
    if len(block.successors) != 2:
        return None
    if _is_mask_test(block) and jump in ("je", "jz", "jne", "jnz"):
        return 0 if jump in ("je", "jz") else 1
    if jump in ("jp", "jnp"):
        return 0 if jump == "jnp" else 1
    return None


def _has_prefetch(block: Block) -> bool:
    return any(_PREFETCH.match(i.text) for i in block.instructions)


def trace(blocks: list[Block], header: int, body: set[int], prefetch: bool) -> list[int] | None:
    """The blocks of one trip round the loop from its header along the common path: at a branch between
    two blocks of the loop, a vector-mask test (a NaN or subnormal check) takes the all-clear side, a parity
    branch (an unordered comparison: NaN) is not taken, and a branch around a prefetch takes the prefetch
    when `prefetch` says so, a branch back to an earlier block is taken (an inner loop keeps looping);
    otherwise the fall-through. None if the walk leaves the loop."""
    path, node = [], header
    for _ in range(4 * len(body) + 4):
        path.append(node)
        block = blocks[node]
        inside = [s for s in block.successors if s in body or s == header]
        if not inside:
            return None
        jump = block.instructions[-1].text.split()[0] if block.instructions else ""
        clear = _all_clear_side(block, jump)
        if clear is not None and block.successors[clear] not in inside:
            return None  # this loop is the rare path's (its branch back comes from the NaN code)
        if len(inside) == 2:
            taken, fall = inside
            if clear is not None:
                node = block.successors[clear]
            elif _has_prefetch(blocks[fall]) != _has_prefetch(blocks[taken]):
                node = fall if _has_prefetch(blocks[fall]) == prefetch else taken
            elif taken <= node:  # a loop's branch back: loops loop (a walk from an outer loop stays inside)
                node = taken
            else:
                node = fall
        else:
            node = inside[0]
        if node == header:
            return path
        if node in path:  # a cycle that bypasses the header: keep the cycle
            return path[path.index(node) :]
    return None


def hot_cycles(functions: list[tuple[str, list]]) -> list[Loop]:
    """Every inner loop of every function along its common path, with and without its optional prefetches.

    A loop is found by a branch back to an earlier label (its header); its body is every block the header
    reaches that reaches the branch again without passing the header. The walk round it (trace) keeps one
    path, so rare code (NaN handling) that the compiler placed inside or outside the loop is left out, and
    a walk from an outer loop's header that runs into an inner loop keeps the inner loop. Each distinct
    trip is one Loop."""
    names = demangle([name for name, _ in functions])
    loops: list[Loop] = []
    for name, (_, items) in zip(names, functions, strict=True):
        blocks, where, starts = basic_blocks(items)
        successors = [block.successors for block in blocks]
        predecessors: list[list[int]] = [[] for _ in blocks]
        for index, block in enumerate(blocks):
            for successor in block.successors:
                predecessors[successor].append(index)
        seen: set[tuple[int, ...]] = set()
        for index, block in enumerate(blocks):
            last = block.instructions[-1].text if block.instructions else ""
            if not last.startswith("j"):
                continue
            target = where.get(last.split()[-1])
            if target is None or target > index:
                continue
            forward = _reach(target, successors.__getitem__)
            backward = _reach(index, predecessors.__getitem__, stop=target)
            body = (forward & backward) | {target}
            for prefetch in (True, False):
                path = trace(blocks, target, body, prefetch)
                if path is None:
                    continue
                key = tuple(sorted(path)) + (prefetch,)
                if key in seen:
                    continue
                seen.add(key)
                instructions = [i for n in path for i in blocks[n].instructions]
                took = any(_has_prefetch(blocks[n]) for n in path)
                if not prefetch and not took and tuple(sorted(path)) + (True,) in seen:
                    continue  # no prefetch to skip: the same trip as the prefetching one
                label = blocks[path[0]].labels[0] if blocks[path[0]].labels else ""
                loops.append(Loop(name, label, instructions, took, items, starts[path[0]]))
    return loops


# ---------------------------------------------------------------------------
# The hot loops.


def source_line(file: str, anchor: str, header: str) -> int:
    """The line number of the first line holding `header` after the first line holding `anchor`."""
    lines = (CSRC / file).read_text().splitlines()
    start = next(n for n, text in enumerate(lines) if anchor in text)
    return next(n for n, text in enumerate(lines[start:], start) if header in text) + 1


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """One hot loop of one op: where its header is, how to tell its hot instance, what an iteration does."""

    op: str  # forward | backward
    pass_: str  # "pass 1" | "pass 2"
    name: str  # the C++ function the loop is written in
    file: str
    anchor: str
    header: str
    dtypes: tuple[str, ...]  # the dtypes that run it: pass 1 sums 16-bit types in float32 runs (add_runs)
    groups: int = 1  # the groups of 16 elements of each row that one trip round the loop adds

    def runs_for(self, dtype: str) -> bool:
        return dtype in self.dtypes


RUN_END_NAME = "add_runs run end"

SPECS = (
    LoopSpec("forward", "pass 1", "dot_lanes_k", "kernel_loops.h", "void dot_lanes_k(",
             "for (; h + kLanes <= h1; h += kLanes) {", dtypes=("float32",)),
    LoopSpec("forward", "pass 1", "add_runs", "kernel_loops.h", "void add_runs(",
             "for (; h + 2 * kLanes <= stop; h += 2 * kLanes) {", dtypes=SIXTEEN_BIT, groups=2),
    LoopSpec("forward", "pass 2", "weighted_sum_groups", "forward_kernel.h", "inline void weighted_sum_groups(",
             "for (int64_t i = 0; i < row_num; ++i) {", dtypes=DTYPES),
    LoopSpec("backward", "pass 1", "dot_lanes_k", "kernel_loops.h", "void dot_lanes_k(",
             "for (; h + kLanes <= h1; h += kLanes) {", dtypes=("float32",)),
    LoopSpec("backward", "pass 1", "add_runs", "kernel_loops.h", "void add_runs(",
             "for (; h + 2 * kLanes <= stop; h += 2 * kLanes) {", dtypes=SIXTEEN_BIT, groups=2),
    LoopSpec("backward", "pass 2", "grad_rows", "backward_kernel.h", "inline void grad_rows(",
             "for (; h + kGroups * kLanes <= h1; h += kGroups * kLanes) {", dtypes=DTYPES),
)


# The end of a float32 run in add_runs (once per kRunGroups inner iterations): each row's two run sums
# widened to float64 and added into its lanes. Straight-line code after the inner loop, found by its lines.
RUN_END = ("kernel_loops.h", "if (h % kRunElements == 0 || h == hidden)", "x_sums[r] = w_sums[r] = vzero();")
KERNEL_FILES = ("kernel_loops.h", "forward_kernel.h", "backward_kernel.h")


# The header that sets a path's own constants (kRunRows); the scalar path's on x86, where its SSE2 lanes run.
PATH_HEADERS = {"scalar": "simd_sse2.h", "avx2": "simd_avx2.h", "avx512": "simd_avx512.h",
                "avx512bf16": "simd_avx512.h"}


def kernel_constant(name: str, path: str | None = None) -> int:
    """A constexpr integer of kernel_loops.h (kRunGroups, kDotRows) or, given a path, of that path's simd_*.h
    (kRunRows), as the modelled sources set it."""
    source = PATH_HEADERS[path] if path else "kernel_loops.h"
    match = re.search(rf"constexpr int(?:64_t)? {name} = (\d+);", (CSRC / source).read_text())
    if match is None:
        raise RuntimeError(f"{name} not found in {source}")
    return int(match.group(1))


def kernel_flag(name: str, path: str) -> bool:
    """A constexpr bool of a path's simd_*.h (kSplitBf16Lines, kBf16NumberStores), as the modelled sources set it;
    false where they do not declare it (sources older than the feature)."""
    match = re.search(rf"constexpr bool {name} = (true|false);", (CSRC / PATH_HEADERS[path]).read_text())
    return match is not None and match.group(1) == "true"


def is_bf16_pass2_as_run(loop: Loop, path: str) -> bool:
    """Whether a bfloat16 pass-2 instance (grad_rows, weighted_sum_groups) is the one finite inputs run at the
    benchmark's shape on path: split lines where the path has them (kSplitBf16Lines: no byte shuffles), else
    stores of numbers where it has those (kBf16NumberStores: no NaN check, vmovmskps)."""
    if kernel_flag("kSplitBf16Lines", path):
        return loop.count(r"^vpshufb\b") == 0
    if kernel_flag("kBf16NumberStores", path):
        return loop.count(r"^vmovmskps\b") == 0
    return True


def run_groups() -> int:
    """kRunGroups: the groups of one float32 run."""
    return kernel_constant("kRunGroups")


def run_end_block(loop: Loop) -> Loop | None:
    """The run end of the add_runs whose inner loop is `loop`: the straight-line code round the first
    instruction of the run end's body lines after the loop (or, failing that, in the function). It reaches
    back and forward over instructions of other files (the intrinsics', simd_*.h's: inlined into it) and
    labels no branch targets (the debug information's), up to a branch target or another line of the
    kernels' files."""
    file, first_text, last_text = RUN_END
    lines = (CSRC / file).read_text().splitlines()
    first = next(n for n, text in enumerate(lines) if first_text in text) + 2  # the line after the `if`
    last = next(n for n, text in enumerate(lines[first:], first) if last_text in text) + 1
    items = loop.items
    targets = {item[1].text.split()[-1] for item in items if item[0] == "insn" and item[1].text.startswith("j")}

    def in_body(item) -> bool:
        return item[0] == "insn" and item[1].file == file and first <= item[1].line <= last

    def foreign(item) -> bool:  # part of the block, whatever its line
        if item[0] == "label":
            return item[1] not in targets
        return item[1].file not in KERNEL_FILES or item[1].line == 0

    for start_at in (loop.position, 0):
        begin = next((n for n in range(start_at, len(items)) if in_body(items[n])), None)
        if begin is not None:
            break
    else:
        return None
    while begin > 0 and foreign(items[begin - 1]):
        begin -= 1
    end = begin
    while end < len(items) and (in_body(items[end]) or foreign(items[end])):
        end += 1
    region = [item[1] for item in items[begin:end] if item[0] == "insn"]
    return Loop(loop.function, "", region, False, items, begin)


def rows_per_call(spec: LoopSpec, rows: int, path: str) -> int:
    """How many rows one call of the loop handles on path at the shape's N + 1 rows (for_row_groups, grad_tile)."""
    if spec.name == "dot_lanes_k":
        groups = -(-rows // kernel_constant("kDotRows"))
        return -(-rows // groups)
    if spec.name.startswith("add_runs"):
        groups = -(-rows // kernel_constant("kRunRows", path))
        return -(-rows // groups)
    if spec.name == "grad_rows":
        return 2  # grad_tile's kRows (the odd last row takes grad_rows<1>, not modelled)
    return 1


def elements_per_iteration(spec: LoopSpec, dtype: str, rows: int, path: str, loop: Loop | None = None) -> int:
    """Row elements (one element of one value row) one iteration of the loop handles."""
    if spec.name == "weighted_sum_groups":
        # a step of four groups prefetches 4 (float32) or 2 (16-bit) lines of the row, a single group one
        return 16 if loop is not None and loop.count(r"^prefetcht1\b") == 1 else 64
    if spec.name == "grad_rows":
        return rows_per_call(spec, rows, path) * 16 * (2 if DTYPE_SIZE[dtype] == 2 else 1)
    if spec.name == RUN_END_NAME:
        return rows_per_call(spec, rows, path) * 16 * run_groups()
    return rows_per_call(spec, rows, path) * 16 * spec.groups


def bytes_per_element(op: str, dtype: str, rows: int) -> float:
    """Memory traffic of an op per row element: the forward reads the rows and writes hidden_states (one row
    per token), the backward reads the rows and grad_hidden_states and writes one gradient row per row
    (streaming stores at large shapes: no read for ownership)."""
    size = DTYPE_SIZE[dtype]
    if op == "forward":
        return size * (1 + 1 / rows)
    return size * (2 + 1 / rows)


def _type_arguments(function: str) -> str:
    """The template arguments of a function's own name (before its parameter list)."""
    head = function.replace("(anonymous namespace)", "").split("(")[0]
    return head[head.find("<") :] if "<" in head else ""


def _loop_dtype_and_op(function: str) -> tuple[str | None, str | None]:
    """(dtype, op) from the enclosing function's name: the loops are either out of line (their own template,
    whose kSquares says the op) or inlined into forward_impl<T> / backward_impl<T>."""
    arguments = _type_arguments(function)
    dtype = next((d for d, cxx in DTYPE_CXX.items() if re.search(rf"[<, ]{re.escape(cxx)}[,>]", arguments)), None)
    head = function.replace("(anonymous namespace)", "").split("(")[0]
    op = None
    if "forward_impl" in head or "weighted_sum" in head:
        op = "forward"
    elif "backward_impl" in head or "grad_rows" in head or "grad_tile" in head:
        op = "backward"
    elif "add_runs" in head or "dot_lanes" in head:
        squares = arguments.strip("<>").split(", ")[1:2]  # their second template argument: kSquares
        op = {"true": "forward", "false": "backward"}.get(squares[0]) if squares else None
    return dtype, op


def find_hot_loop(loops: list[Loop], spec: LoopSpec, dtype: str, rows: int, path: str) -> Loop | None:
    """The instance of spec's loop that runs most at the shape: for spec's dtype and op, the right row count,
    and the variant that prefetches the next token's rows (every token but a core's last block)."""
    if not spec.runs_for(dtype):
        return None
    line = source_line(spec.file, spec.anchor, spec.header)
    k = rows_per_call(spec, rows, path)
    candidates = []
    for loop in loops:
        if (spec.file, line) not in loop.lines():
            continue
        if _loop_dtype_and_op(loop.function) != (dtype, spec.op):
            continue
        head = loop.function.replace("(anonymous namespace)", "").split("(")[0]
        if spec.name in head and not re.search(rf"{spec.name}<{k}, ", head):
            continue  # an out-of-line instance for another row count
        prefetch_l2 = loop.count(r"^prefetcht1\b")
        if spec.name in ("dot_lanes_k", "add_runs"):
            if not loop.prefetching or prefetch_l2 != k:  # one prefetch per row: the K-row instance
                continue
        elif spec.name == "weighted_sum_groups":
            # a row's lines in a step of four groups (float32: 4, 16-bit: 2); one line: a single group
            if not loop.prefetching or prefetch_l2 not in (DTYPE_SIZE[dtype], 1):
                continue
            if dtype == "bfloat16" and not is_bf16_pass2_as_run(loop, path):
                continue
        elif spec.name == "grad_rows":
            if loop.prefetching:  # rows past the first pair do not prefetch
                continue
            if dtype == "bfloat16" and not is_bf16_pass2_as_run(loop, path):
                continue
        candidates.append(loop)
    if spec.name == "grad_rows":
        # streaming stores, as at the benchmark shape (outputs of 8 MiB and more), where the path has them
        candidates = [loop for loop in candidates if loop.count(r"^v?movnt")] or candidates
    if not candidates:
        return None
    # The step of four groups where it is an inner loop; the single group where the step holds inner loops
    # (scalar: a loop over the groups). Two instances can remain where the compiler versioned a loop: take the
    # longer, the general one, so as not to model a shortcut that is not taken.
    return max(candidates, key=lambda loop: (loop.count(r"^prefetcht1\b"), len(loop.instructions)))


# ---------------------------------------------------------------------------
# llvm-mca.


@dataclasses.dataclass
class Model:
    cycles_per_iteration: float
    block_rthroughput: float
    bound: str  # what binds: the busiest resource and its load, or the dependency chain
    top_instructions: list[tuple[str, float]]  # the busiest resource's largest users (mnemonic, cycles)
    report: str
    unmodelled: list[str] = dataclasses.field(default_factory=list)  # mnemonics whose latency is unusable

    @property
    def flagged(self) -> bool:
        return bool(self.unmodelled)


def mca_input(loop: Loop) -> str:
    """The loop body as llvm-mca input: its instructions, branches included (llvm-mca does not follow them)."""
    return "".join(f"\t{i.text}\n" for i in loop.instructions)


def run_mca(loop: Loop, cpu: str, mca: str = "llvm-mca", extra: tuple[str, ...] = ()) -> Model:
    command = [mca, "-mtriple=x86_64-unknown-linux-gnu", f"-mcpu={cpu}", f"-iterations={ITERATIONS}",
               "-resource-pressure", "-bottleneck-analysis", *extra]
    result = subprocess.run(command, input=mca_input(loop), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"llvm-mca -mcpu={cpu} failed: {result.stderr.strip()[:400]}")
    return parse_mca(result.stdout)


def parse_mca(report: str) -> Model:
    iterations = int(re.search(r"^Iterations:\s+(\d+)", report, re.M).group(1))
    cycles = int(re.search(r"^Total Cycles:\s+(\d+)", report, re.M).group(1))
    rthroughput = float(re.search(r"^Block RThroughput:\s+([\d.]+)", report, re.M).group(1))
    per_iteration = cycles / iterations
    names = dict(re.findall(r"^\[(\d+(?:\.\d+)?)\]\s+-\s+(\S+)", report, re.M))
    pressure = re.search(r"Resource pressure per iteration:\n(.*)\n(.*)\n", report)
    bound, top = "?", []
    if pressure:
        columns = re.findall(r"\[([\d.]+)\]", pressure.group(1))
        values = [0.0 if v == "-" else float(v) for v in pressure.group(2).split()]
        load = dict(zip(columns, values, strict=False))
        busiest = max(load, key=load.get)
        share = load[busiest] / per_iteration if per_iteration else 0.0
        bound = f"{names.get(busiest, busiest)} {load[busiest]:.1f}/{per_iteration:.1f}"
        if share < 0.8:
            bound = f"dependencies ({bound})"
        by_instruction = report.split("Resource pressure by instruction:", 1)
        if len(by_instruction) == 2:
            table = by_instruction[1].strip().splitlines()
            heads = re.findall(r"\[([\d.]+)\]", table[0])
            column = heads.index(busiest) if busiest in heads else None
            usage: collections.Counter = collections.Counter()
            for row in table[1:]:
                parts = row.split()
                if len(parts) <= len(heads) or column is None:
                    continue
                value = parts[column]
                mnemonic = parts[len(heads)]
                usage[mnemonic] += 0.0 if value == "-" else float(value)
            top = [(m, c) for m, c in usage.most_common(4) if c > 0]
    # llvm-mca's models give an instruction they have no data for a placeholder latency of 100 cycles (LLVM 14's
    # znver1/znver2 do so for vcvtph2ps/vcvtps2ph on ymm); LLVM 19's sapphirerapids gives streaming stores 507,
    # and llvm-mca retires in order, so the loop waits for the store's trip to memory, which a CPU does not.
    # Such a loop's figure says nothing about the CPU.
    unmodelled = sorted(_unusable_latencies(report))
    return Model(per_iteration, rthroughput, bound, top, report, unmodelled)


def _unusable_latencies(report: str) -> set[str]:
    """Mnemonics of the Instruction Info view whose latency is 100 cycles or more (see parse_mca)."""
    info = report.split("Instruction Info:", 1)
    if len(info) < 2:
        return set()
    found = set()
    for row in info[1].split("\n\n", 2)[1].splitlines()[1:]:
        match = re.match(r"^\s*(\d+)\s+(\d+)\s+[\d.]+\s+(?:[*U]\s+)*(\S+)", row)
        if match and int(match.group(2)) >= 100:
            found.add(match.group(3))
    return found


_MEMORY = re.compile(r"\(")
_FMA_OR_MUL = re.compile(r"^v?(p?mul|fn?m(add|sub))")


def zen1_split(loop: Loop, znver1: Model) -> Model:
    """A bound on one iteration on Zen 1 from instruction counts: Zen 1's four floating-point pipes are 128 bits
    wide, two of them multiply or fuse; it loads two and stores one 128-bit value per cycle (AMD's software
    optimization guide for family 17h), so a 256-bit operation, load or store takes two slots. The larger
    of that bound and llvm-mca's znver1 figure."""
    counts = collections.Counter()
    for instruction in loop.instructions:
        mnemonic, _, operands = instruction.text.partition(" ")
        operands = operands.strip()
        if not mnemonic.startswith(("v", "p", "add", "sub", "mul", "cvt", "min", "max", "and", "xor", "or", "movs",
                                    "movap", "movup", "movd", "unpck", "shuf")) or mnemonic.startswith("prefetch"):
            continue
        if not any(r in operands for r in ("%xmm", "%ymm")):
            continue
        slots = 2 if "%ymm" in operands or (mnemonic.startswith("v") and "ymm" in mnemonic) else 1
        parts = [part.strip() for part in re.split(r",(?![^(]*\))", operands)]
        store = bool(parts) and _MEMORY.search(parts[-1]) is not None
        load = any(_MEMORY.search(part) for part in parts[:-1])
        if store:
            counts["store"] += slots
            continue
        if load:
            counts["load"] += slots
        if mnemonic.startswith(("vmovap", "vmovup", "vmovdq", "movap", "movup", "movdq", "vbroadcast")) and load:
            continue  # a plain load: no pipe
        counts["pipe"] += slots
        if _FMA_OR_MUL.match(mnemonic):
            counts["fma"] += slots
    bounds = {
        "FP pipes": counts["pipe"] / 4,
        "FMA pipes": counts["fma"] / 2,
        "loads": counts["load"] / 2,
        "stores": counts["store"] / 1,
    }
    name, cycles = max(bounds.items(), key=lambda item: item[1])
    if cycles <= znver1.cycles_per_iteration:
        return dataclasses.replace(znver1, bound=f"as znver1 ({name} {cycles:.1f})")
    return Model(cycles, cycles, f"{name} {cycles:.1f} (128-bit halves)", [], "", znver1.unmodelled)


# ---------------------------------------------------------------------------
# The table.


@dataclasses.dataclass
class Row:
    path: str
    op: str
    dtype: str
    spec: LoopSpec
    loop: Loop | None
    models: dict[str, Model]

    def flagged(self, cpu: str) -> bool:
        return cpu in self.models and self.models[cpu].flagged

    def cycles_per_element(self, cpu: str, rows: int) -> float | None:
        model = self.models.get(cpu)
        if model is None:
            return None
        return model.cycles_per_iteration / elements_per_iteration(self.spec, self.dtype, rows, self.path, self.loop)


def hot_loops(path: str, assembly: Path, dtypes=DTYPES, rows: int = DEFAULT_ROWS) -> list[Row]:
    """The hot loops of one path's assembly (no modelling yet): one Row per op, pass and dtype."""
    loops = hot_cycles(read_functions(assembly))
    result = []
    for spec in SPECS:
        for dtype in dtypes:
            if not spec.runs_for(dtype):
                continue
            loop = find_hot_loop(loops, spec, dtype, rows, path)
            result.append(Row(path, spec.op, dtype, spec, loop, {}))
            if spec.name == "add_runs":
                end = dataclasses.replace(spec, name=RUN_END_NAME)
                result.append(Row(path, spec.op, dtype, end, run_end_block(loop) if loop else None, {}))
    return result


def memory_cycles_per_element(op: str, dtype: str, rows: int, clock_ghz: float, bandwidth_gbs: float) -> float:
    return bytes_per_element(op, dtype, rows) * clock_ghz / bandwidth_gbs


def print_tables(rows_by_path: dict[str, list[Row]], rows: int, clock_ghz: float, bandwidth_gbs: float,
                 out=sys.stdout) -> None:
    def fmt(value):
        return "-" if value is None else f"{value:.2f}"

    print(f"Cycles per row element (llvm-mca model, {ITERATIONS} iterations, loads from L1), N+1 = {rows} rows; "
          f"memory at {bandwidth_gbs:g} GB/s per core and {clock_ghz:g} GHz. Per op: the passes' sum, and in brackets "
          "that sum as a share of the memory time (over 100%: the arithmetic takes longer than the memory).",
          file=out)
    for path, path_rows in rows_by_path.items():
        # The path's usual columns first, then any other model asked for (--cpus), in the order modelled.
        modelled = dict.fromkeys(c for r in path_rows for c in r.models)
        cpus = [c for c in CPUS_FOR_PATH[path] if c in modelled] + [c for c in modelled if c not in CPUS_FOR_PATH[path]]
        print(f"\n### {path}\n", file=out)
        print("| op | dtype | loop | insns | elems/iter | " + " | ".join(cpus) + " |", file=out)
        print("|---|---|---|---|---|" + "---|" * len(cpus), file=out)
        for r in path_rows:
            insns = len(r.loop.instructions) if r.loop else "not found"
            cells = [fmt(r.cycles_per_element(c, rows)) + ("!" if r.flagged(c) else "") for c in cpus]
            elements = elements_per_iteration(r.spec, r.dtype, rows, r.path, r.loop)
            print(f"| {r.op} | {r.dtype} | {r.spec.pass_} `{r.spec.name}` | {insns} | {elements} | "
                  + " | ".join(cells) + " |", file=out)
        print("\n| op | dtype | bytes/elem | memory c/elem | " + " | ".join(f"{c}" for c in cpus) + " |", file=out)
        print("|---|---|---|---|" + "---|" * len(cpus), file=out)
        for op in ("forward", "backward"):
            for dtype in DTYPES:
                parts = [r for r in path_rows if r.op == op and r.dtype == dtype]
                if not parts:
                    continue
                memory = memory_cycles_per_element(op, dtype, rows, clock_ghz, bandwidth_gbs)
                cells = []
                for c in cpus:
                    values = [r.cycles_per_element(c, rows) for r in parts]
                    if any(v is None for v in values):
                        cells.append("-")
                        continue
                    total = sum(values)
                    mark = "!" if any(r.flagged(c) for r in parts) else ""
                    cells.append(f"{total:.2f}{mark} ({100 * total / memory:.0f}%)")
                print(f"| {op} | {dtype} | {bytes_per_element(op, dtype, rows):.2f} | {memory:.2f} | "
                      + " | ".join(cells) + " |", file=out)
        flagged = sorted({(c, m) for r in path_rows for c, model in r.models.items() for m in model.unmodelled
                          if c != ZEN1_SPLIT})
        if flagged:
            named = "; ".join(f"{m} on {c}" for c, m in flagged)
            print(f"\n!: llvm-mca gives a latency of 100 cycles or more to {named}"
                  " (a placeholder where its model has no data, or a streaming store's trip to memory, which it makes"
                  " the loop wait for): those figures are not the CPU's.", file=out)


def print_bounds(rows_by_path: dict[str, list[Row]], out=sys.stdout) -> None:
    print("\nWhat binds each loop (busiest llvm-mca resource: its cycles per iteration / the iteration's cycles; "
          "'dependencies' where no resource is 80% busy), and its largest users:", file=out)
    for path, path_rows in rows_by_path.items():
        for r in path_rows:
            for cpu, model in r.models.items():
                users = ", ".join(f"{m} {c:.1f}" for m, c in model.top_instructions)
                print(f"  {path:10} {r.op:8} {r.dtype:8} {r.spec.pass_} {r.spec.name:19} {cpu:15} "
                      f"{model.bound:28} {users}", file=out)


CSV_FIELDS = ("path", "op", "dtype", "pass", "loop", "cpu", "instructions", "elements_per_iteration",
              "cycles_per_iteration", "cycles_per_element", "bound", "placeholder_latency")


def write_csv(rows_by_path: dict[str, list[Row]], rows: int, target: Path) -> None:
    """One line per loop and CPU model (zen1-split included), for plots and diffs between commits."""
    with open(target, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(CSV_FIELDS)
        for path, path_rows in rows_by_path.items():
            for r in path_rows:
                for cpu, model in r.models.items():
                    writer.writerow([path, r.op, r.dtype, r.spec.pass_, r.spec.name, cpu, len(r.loop.instructions),
                                     elements_per_iteration(r.spec, r.dtype, rows, r.path, r.loop),
                                     f"{model.cycles_per_iteration:.2f}", f"{r.cycles_per_element(cpu, rows):.4f}",
                                     model.bound, " ".join(model.unmodelled)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/loop_model.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated instruction set paths")
    parser.add_argument("--cpus", default="", help="comma-separated llvm-mca CPU models (default: per path)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="N + 1, the rows per token (default 9)")
    parser.add_argument("--clock-ghz", type=float, default=DEFAULT_CLOCK_GHZ)
    parser.add_argument("--bandwidth-gbs", type=float, default=DEFAULT_BANDWIDTH_GBS, help="memory per core")
    parser.add_argument("--work-dir", default="", help="keep the assembly and llvm-mca inputs here")
    parser.add_argument("--reuse", action="store_true", help="reuse assembly already in --work-dir")
    parser.add_argument("--views", action="store_true", help="print what binds each loop")
    parser.add_argument("--dump", action="store_true", help="write each loop's llvm-mca input and report")
    parser.add_argument("--list", action="store_true", help="only list the loops found (no llvm-mca)")
    parser.add_argument("--csv", default="", help="also write one line per loop and CPU model to this file")
    parser.add_argument("--csrc", default="", help="model a modified copy of op_kernel/csrc (a proposal) instead")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    parser.add_argument("--mca", default="llvm-mca")
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"--paths takes {', '.join(PATHS)}; got {', '.join(unknown)}")
    global CSRC
    if args.csrc:
        CSRC = Path(args.csrc).resolve()
    if not (CSRC / "isa_scalar.cpp").exists():
        print(f"loop_model: no C++ sources at {CSRC}: run it from a source checkout of attnres-ge (a wheel ships "
              "none)", file=sys.stderr)
        return 2
    for tool in (args.cxx,) + (() if args.list else (args.mca,)):
        if shutil.which(tool) is None:
            print(f"loop_model: {tool} is not installed (Debian: apt-get install g++ llvm)", file=sys.stderr)
            return 2
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="attnres-loop-model-"))
    work.mkdir(parents=True, exist_ok=True)
    rows_by_path: dict[str, list[Row]] = {}
    for path in paths:
        assembly = work / f"isa_{path}.s"
        if not (args.reuse and assembly.exists()):
            print(f"compiling isa_{path}.cpp ...", file=sys.stderr, flush=True)
            assembly = compile_to_assembly(path, work, args.cxx)
        path_rows = hot_loops(path, assembly, rows=args.rows)
        rows_by_path[path] = path_rows
        cpus = [c for c in (args.cpus.split(",") if args.cpus else CPUS_FOR_PATH[path]) if c]
        for r in path_rows:
            if r.loop is None:
                print(f"{path}: no hot loop found for {r.op} {r.dtype} {r.spec.name}", file=sys.stderr)
                continue
            if args.list:
                print(f"{path:10} {r.op:8} {r.dtype:8} {r.spec.pass_} {r.spec.name:19} "
                      f"{len(r.loop.instructions):4} instructions  in {r.loop.function[:100]}")
                continue
            stem = f"{path}-{r.op}-{r.dtype}-{r.spec.name}".replace(" ", "_")
            if args.dump:
                (work / f"{stem}.s").write_text(mca_input(r.loop))
            for cpu in cpus:
                if (path, cpu) in UNSUPPORTED or cpu == ZEN1_SPLIT:
                    continue
                r.models[cpu] = run_mca(r.loop, cpu, args.mca)
                if args.dump:
                    (work / f"{stem}-{cpu}.txt").write_text(r.models[cpu].report)
            if ZEN1_SPLIT in cpus and "znver1" in r.models:
                r.models[ZEN1_SPLIT] = zen1_split(r.loop, r.models["znver1"])
        if not args.reuse and not args.work_dir:
            assembly.unlink()
    if args.list:
        return 0 if all(r.loop for rs in rows_by_path.values() for r in rs) else 1
    print_tables(rows_by_path, args.rows, args.clock_ghz, args.bandwidth_gbs)
    if args.views:
        print_bounds(rows_by_path)
    if args.csv:
        write_csv(rows_by_path, args.rows, Path(args.csv))
    if args.work_dir:
        print(f"\nassembly{' and llvm-mca inputs/reports' if args.dump else ''} in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
