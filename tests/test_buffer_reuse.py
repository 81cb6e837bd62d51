"""Graph-mode buffer reuse: a compiled call never writes memory that anyone can still reach.

Every way of keeping a result (the tensor, a view, its storage object, a typed storage, a weak
reference to its storage, a shared-memory export) must see the same bytes after the next call of
the compiled graph; a result whose storage was freed or shrunk (`resize_(0)`, FSDP2's
`resize_storage_bytes_`) must be replaced by a fresh buffer, never written. Each case runs on the
C++ GraphNode and on the Python BufferPool (native and Python kernels).
"""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch

import attnres_ge  # noqa: F401
import attnres_ge.op_kernel as op_kernel
from attnres_ge.ge_plugin import ge
from attnres_ge.ge_plugin.converters import make_converter
from attnres_ge.ge_plugin.local_ge import compile_graph
from attnres_ge.ge_plugin.op_common import CPP_ENTRY
from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS

convert_block_attention_residuals = make_converter(BLOCK_ATTENTION_RESIDUALS, ge)

T, N, H = 8, 3, 64
RUNNERS = ["cpp-node", "python-pool", "python-kernels"]


def forward_graph():
    with ge.Graph("reuse") as graph:
        shapes = [[T, H], [T, N, H], [1, H], [H]]
        data = [ge.Data(i, torch.float32, shape, node_name=f"input{i}") for i, shape in enumerate(shapes)]
        ge.NetOutput(list(convert_block_attention_residuals(*data, -1, 1e-6, True)))
    return graph.graph_def


def forward_inputs(seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in ([T, H], [T, N, H], [1, H], [H])]


@pytest.fixture(params=RUNNERS)
def compiled(request):
    """A compiled forward graph run by the C++ GraphNode, or by Python's BufferPool (native or Python kernels)."""
    if request.param == "cpp-node" and not CPP_ENTRY:
        pytest.skip("the ops' C++ entry is not built")
    graph = compile_graph(forward_graph())
    if request.param != "cpp-node":
        graph.node = None
    if request.param == "python-kernels":
        op_kernel.KERNELS.set_implementation("python")
    yield graph
    op_kernel.KERNELS.set_implementation(None)


def as_tensor(storage, like):
    """A reader of `storage` as a tensor shaped like `like`, holding nothing of `like` itself."""
    shape, dtype = like.shape, like.dtype
    return lambda: torch.tensor([], dtype=dtype).set_(storage, 0, shape)


# Each holder keeps one result some way, drops every other reference, and returns a reader of what it kept
# (None once nothing can read it).
def keep_tensor(out):
    return lambda: out


def keep_view(out):
    view = out[1:]
    return lambda: view


def keep_untyped_storage(out):
    return as_tensor(out.untyped_storage(), out)


def keep_typed_storage(out):
    typed = out.storage()
    return as_tensor(typed._untyped_storage, out)


def keep_weak_storage(out):
    # A weak reference keeps nothing alive; but while it still answers, what it answers must be intact.
    storage = weakref.ref(out.untyped_storage())
    shape, dtype = out.shape, out.dtype
    return lambda: None if storage() is None else torch.tensor([], dtype=dtype).set_(storage(), 0, shape)


def keep_shared_memory(out):
    # What a torch.multiprocessing queue does to a CPU tensor it sends: move it to shared memory and hand
    # the receiver a file descriptor. The receiver's mapping (here, our own) outlives every tensor here.
    out.share_memory_()
    fd, size = out.untyped_storage()._share_fd_cpu_()
    mapping = mmap.mmap(os.dup(fd), size)
    shape, dtype, numel = out.shape, out.dtype, out.numel()
    return lambda: torch.frombuffer(mapping, dtype=dtype, count=numel).view(shape)


HOLDERS = [keep_tensor, keep_view, keep_untyped_storage, keep_typed_storage, keep_weak_storage, keep_shared_memory]


@pytest.mark.parametrize("holder", HOLDERS, ids=lambda holder: holder.__name__)
def test_a_held_result_is_intact_after_the_next_call(compiled, holder):
    first = compiled(*forward_inputs(seed=0))
    snapshots = [out.clone() for out in first]
    readers = [holder(out) for out in first]
    del first
    gc.collect()
    second = compiled(*forward_inputs(seed=1))
    for read, snapshot in zip(readers, snapshots, strict=True):
        now = read()
        if now is None:
            continue  # the weak reference died: nothing can read it
        expected = snapshot[1:] if holder is keep_view else snapshot
        assert torch.equal(now, expected), f"{holder.__name__}: the next call overwrote a held result"
    fresh = torch.ops.attnres.block_attention_residuals(*forward_inputs(seed=1), -1, 1e-6, True)
    assert all(torch.equal(a, b) for a, b in zip(second, fresh, strict=True))


# The three ways a result's storage is freed or shrunk, each with a graph of its own, in one process per runner
# (a crash fails the runner's test; the lines printed so far say which ways had passed): a process each took
# three times the interpreter's and torch's start-up for the same checks.
FREE_WAYS = {"resize_0": -1, "resize_storage_bytes_0": 0, "shrunk_to_4096": 4096}

CRASH_SCRIPT = """
import torch, attnres_ge
import attnres_ge.op_kernel as op_kernel
from attnres_ge.ge_plugin import ge
from attnres_ge.ge_plugin.converters import make_converter
from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS
convert_block_attention_residuals = make_converter(BLOCK_ATTENTION_RESIDUALS, ge)
from attnres_ge.ge_plugin.local_ge import compile_graph

T, N, H = 512, 4, 1024  # outputs of 2 MiB: a write into a freed slot lands far outside the heap's slack
for way, nbytes in {ways}.items():
    with ge.Graph("crash") as graph:
        shapes = [[T, H], [T, N, H], [1, H], [H]]
        data = [ge.Data(i, torch.float32, shape, node_name=f"input{{i}}") for i, shape in enumerate(shapes)]
        ge.NetOutput(list(convert_block_attention_residuals(*data, -1, 1e-6, True)))
    compiled = compile_graph(graph.graph_def)
    if "{runner}" != "cpp-node":
        compiled.node = None
    if "{runner}" == "python-kernels":
        op_kernel.KERNELS.set_implementation("python")
    inputs = [torch.randn(shape) for shape in shapes]
    expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    for _ in range(4):
        out = compiled(*inputs)
        assert all(torch.equal(a, b) for a, b in zip(out, expected)), way
        for tensor in out:
            if nbytes < 0:
                tensor.untyped_storage().resize_(0)
            else:
                torch.ops.inductor.resize_storage_bytes_(tensor, nbytes)  # how FSDP2 frees
        del out, tensor
        junk = [torch.ones(1000) for _ in range(200)]  # the heap is used, and would be corrupted, in between
    op_kernel.KERNELS.set_implementation(None)  # the next way's graph is compiled as this one was
    print("ok", way, flush=True)
"""


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_freed_or_shrunk_result_is_replaced_never_written(runner):
    """Each call finds the previous call's storages freed or shrunk (each of FREE_WAYS): it must give correct
    results, not crash."""
    if runner == "cpp-node" and not CPP_ENTRY:
        pytest.skip("the ops' C++ entry is not built")
    script = textwrap.dedent(CRASH_SCRIPT).format(runner=runner, ways=FREE_WAYS)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.splitlines() == [f"ok {way}" for way in FREE_WAYS], (
        f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    flags, inside = [], False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, stop = (int(bound, 16) for bound in head.split("-"))
                inside = start <= address < stop
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    return flags


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads mappings from /proc (Linux)")
@pytest.mark.parametrize("runner", ["cpp-node", "python-pool"])
def test_large_planned_buffers_are_advised_to_use_huge_pages(runner):
    """A graph node's buffers of MIN_HUGE_BYTES or more lie in memory advised MADV_HUGEPAGE ("hg")."""
    from attnres_ge.op_kernel import host_memory

    if not host_memory.huge_pages_available():
        pytest.skip("transparent huge pages are off on this machine")
    if runner == "cpp-node" and not CPP_ENTRY:
        pytest.skip("the ops' C++ entry is not built")
    tokens, hidden = 1024, host_memory.MIN_HUGE_BYTES // (1024 * 4)  # hidden_states of exactly MIN_HUGE_BYTES
    with ge.Graph("huge") as graph:
        shapes = [[tokens, hidden], [tokens, 1, hidden], [1, hidden], [hidden]]
        data = [ge.Data(i, torch.float32, shape, node_name=f"input{i}") for i, shape in enumerate(shapes)]
        ge.NetOutput(list(convert_block_attention_residuals(*data, -1, 1e-6, True)))
    compiled = compile_graph(graph.graph_def)
    if runner != "cpp-node":
        compiled.node = None
    hidden_states = compiled(*(torch.ones(shape) for shape in shapes))[0]
    inside = -(-hidden_states.data_ptr() // host_memory.HUGE_PAGE) * host_memory.HUGE_PAGE  # its aligned part
    assert "hg" in vm_flags(inside), vm_flags(inside)
