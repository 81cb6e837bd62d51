"""The native kernels' threads: at most torch.get_num_threads() of them (from Python and from the
C++ entry), the same bits for any count, idle between calls, and a forked child can call the op."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import FORWARD_KERNEL, assert_bitwise_equal, make_inputs

from attnres_ge.ge_plugin import op_common
from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile
from attnres_ge.op_kernel import kernel

native = pytest.importorskip("attnres_ge.op_kernel.native", reason="the native kernels are not built")
FORWARD_NAMES = ("hidden_states", "inv_norm", "probs")
TIMEOUT_S = 240  # a hang fails the test instead of the suite


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def long_call_tokens(blocks, hidden):
    """The fewest float32 tokens that make a forward call long enough for torch's OpenMP team on two threads."""
    return -(-native.openmp_team_min_bytes(2) // ((blocks + 2) * hidden * 4))


def gnu_openmp_loaded():
    """Whether this process has GNU libgomp loaded (torch's wheels link it), as /proc tells; False where
    there is no /proc (not Linux)."""
    if not os.path.exists("/proc/self/maps"):
        return False
    with open("/proc/self/maps") as maps:
        return "libgomp" in maps.read()


def forward_on(inputs, cores):
    """The native forward with a tiling planned for `cores` cores (tasks), whatever the host has."""
    partial, blocks, _, _ = inputs
    tokens, count, hidden = blocks.shape
    platform = PlatformInfo(PlatformProfile("test", cores, 1 << 20))
    result = forward_tiling.tiling(forward_tiling.parse(platform), tokens, count, hidden, partial.dtype, 1e-6, True,
                                   platform)
    assert result.data.used_core_num == cores
    outputs = (torch.empty_like(partial), torch.empty(tokens, count + 1), torch.empty(tokens, count + 1))
    kernel(FORWARD_KERNEL, "native")(*inputs, *outputs, torch.empty(0, dtype=torch.uint8),
                                                      result.data)
    return outputs


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_a_call_uses_at_most_torchs_thread_count_with_the_same_bits(threads, restore_threads):
    inputs = make_inputs(64, 3, 100, seed=1)
    torch.set_num_threads(1)
    expected = forward_on(inputs, 6)
    torch.set_num_threads(threads)
    outputs = forward_on(inputs, 6)  # six tasks
    assert native.last_call_threads() == min(threads, 6)
    for name, a, b in zip(FORWARD_NAMES, outputs, expected, strict=True):
        assert_bitwise_equal(name, a, b)


def test_back_to_back_short_calls_give_their_own_bits(restore_threads):
    """Short calls one after the other on several threads: the caller may run all of a call's tasks before a
    worker wakes, and a worker that wakes late must neither join a finished call (its context is gone) nor
    miss the next one. Alternating shapes and task counts, each result against its one-thread run."""
    cases = [make_inputs(tokens, 2, 48, seed=tokens) for tokens in (2, 3, 5)]
    torch.set_num_threads(1)
    expected = [forward_on(inputs, len(inputs[0])) for inputs in cases]
    torch.set_num_threads(3)
    for call in range(600):
        index = call % len(cases)
        outputs = forward_on(cases[index], len(cases[index][0]))
        for name, a, b in zip(FORWARD_NAMES, outputs, expected[index], strict=True):
            assert_bitwise_equal(f"call {call}: {name}", a, b)


@pytest.mark.skipif(not op_common.CPP_ENTRY, reason="the C++ eager entry is not built")
def test_the_cpp_entry_passes_torchs_thread_count(restore_threads, monkeypatch):
    from attnres_ge.op_kernel.launcher import default_runtime
    from attnres_ge.op_proto import FORWARD, TensorMeta

    op = torch.ops.attnres.block_attention_residuals.default
    inputs = make_inputs(512, 3, 96, seed=2)
    metas = {"partial_block": TensorMeta((512, 96), torch.float32),
             "block_res": TensorMeta((512, 3, 96), torch.float32)}
    tasks = default_runtime().tiling(FORWARD_KERNEL, metas, FORWARD.bind_attrs({"need_backward": True})).data
    python_entry_calls = []
    launch = op_common._launch
    monkeypatch.setattr(op_common, "_launch", lambda *args: python_entry_calls.append(1) or launch(*args))
    op(*inputs, -1, 1e-6, True)  # the first call of a signature runs the Python entry; repeats run in C++
    for threads in (1, 2):
        torch.set_num_threads(threads)
        op(*inputs, -1, 1e-6, True)
        assert native.last_call_threads() == min(threads, tasks.used_core_num)
    assert len(python_entry_calls) <= 1  # the repeats ran in C++


def run_script(body: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(body)
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S,
                              cwd=os.path.dirname(__file__))
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the script hung (killed after {TIMEOUT_S} s); stderr so far: {error.stderr!r}")


FORK_SCRIPT = """
    import os
    import torch
    from conftest import make_inputs
    from test_kernel_threads import forward_on
    from attnres_ge import block_attention_residuals
    from attnres_ge.op_kernel import native

    inputs = make_inputs(48, 3, 64, seed=3)
    torch.set_num_threads(2)
    parent_kernel = forward_on(inputs, 4)[0]
    assert native.last_call_threads() == 2  # the parent's pool has a worker when it forks
    parent_op = block_attention_residuals(*inputs)
    pid = os.fork()
    if pid == 0:
        if {limit}:
            torch.set_num_threads(1)
        same = torch.equal(forward_on(inputs, 4)[0].view(torch.int32), parent_kernel.view(torch.int32))
        threads = native.last_call_threads()
        same_op = torch.equal(block_attention_residuals(*inputs).view(torch.int32), parent_op.view(torch.int32))
        os._exit(0 if same and same_op and threads == torch.get_num_threads() else 3)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("limit", [True, False], ids=["child-set_num_threads-1", "child-default-threads"])
def test_a_forked_child_calls_the_op_after_the_parent_did(limit):
    result = run_script(FORK_SCRIPT.format(limit=limit))
    assert result.returncode == 0, result.stderr
    assert "child exit 0" in result.stdout, result.stdout + result.stderr


IDLE_SCRIPT = """
    import os, threading, time
    import torch
    from conftest import make_inputs
    from test_kernel_threads import forward_on
    from attnres_ge.op_kernel import native

    def other_threads_cpu_ticks():
        main = threading.get_native_id()
        ticks = 0
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != main:
                with open(f"/proc/self/task/{tid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks

    inputs = make_inputs(256, 4, 512, seed=4)
    torch.set_num_threads(4)
    threads_before = len(os.listdir("/proc/self/task"))
    forward_on(inputs, 4)
    assert native.last_call_threads() == 4
    print("new threads", len(os.listdir("/proc/self/task")) - threads_before)
    start = other_threads_cpu_ticks()
    time.sleep(0.5)
    print("idle ticks", other_threads_cpu_ticks() - start, "per second", os.sysconf("SC_CLK_TCK"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads threads from /proc (Linux)")
def test_worker_threads_sleep_between_calls():
    """After a call, the kernel's workers take no CPU time (no spinning against the caller's next op)."""
    result = run_script(IDLE_SCRIPT)
    assert result.returncode == 0, result.stderr
    new_threads = int(result.stdout.split("new threads ")[1].split()[0])
    idle_ticks = int(result.stdout.split("idle ticks ")[1].split()[0])
    assert new_threads == 3  # three workers beside the caller
    assert idle_ticks <= 2, f"the workers used {idle_ticks} clock ticks in 0.5 s of idling"


def test_one_thread_starts_no_worker():
    result = run_script("""
        import os
        import torch
        from conftest import make_inputs
        from test_kernel_threads import forward_on
        from attnres_ge.op_kernel import native

        torch.set_num_threads(1)
        inputs = make_inputs(64, 3, 64, seed=6)
        before = len(os.listdir("/proc/self/task"))
        forward_on(inputs, 4)
        print(native.last_call_threads(), len(os.listdir("/proc/self/task")) - before)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "0"]


# Long calls on torch's OpenMP team (op_kernel/csrc/openmp_team.h).
OPENMP_SCRIPT = """
    import os
    import torch
    from conftest import make_inputs
    from test_kernel_threads import forward_on, gnu_openmp_loaded, long_call_tokens
    from attnres_ge.op_kernel import native

    def threads():
        return len(os.listdir("/proc/self/task"))

    def torch_parallel_op():  # at::parallel_for on torch's OpenMP team
        values = torch.arange(1 << 20, dtype=torch.float32)
        assert torch.equal(values + values, values * 2)

    torch.set_num_threads(1)
    blocks, hidden = 2, 1024
    tokens = long_call_tokens(blocks, hidden)  # a call just long enough
    long_inputs = make_inputs(tokens, blocks, hidden, seed=7)
    short_inputs = make_inputs(tokens // 8, blocks, hidden, seed=7)
    expected = forward_on(long_inputs, 8)  # the caller alone
    torch.set_num_threads(2)
    forward_on(short_inputs, 2)  # the kernels' own worker exists from here on
    torch_parallel_op()
    with_team = threads()
    calls = native.torch_team_calls()
    forward_on(short_inputs, 2)
    print("short:", native.torch_team_calls() - calls, native.last_call_threads(), threads() - with_team)
    outputs = forward_on(long_inputs, 8)
    print("long:", native.torch_team_calls() - calls, native.last_call_threads(), threads() - with_team)
    torch_parallel_op()
    print("torch again:", threads() - with_team)
    print("gnu openmp:", int(gnu_openmp_loaded()))
    for a, b in zip(outputs, expected):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
"""


def printed_counts(result: subprocess.CompletedProcess) -> dict[str, list[int]]:
    """{name: numbers} of the script's "name: n n" lines."""
    assert result.returncode == 0, result.stderr
    lines = (line.split(":") for line in result.stdout.splitlines())
    return {name: [int(n) for n in numbers.split()] for name, numbers in lines}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads threads from /proc (Linux)")
@pytest.mark.parametrize("wait_policy", ["", "PASSIVE"], ids=["default-wait-policy", "passive"])
def test_a_long_call_runs_on_torchs_openmp_team(wait_policy, monkeypatch):
    """A long call runs its tasks on the team torch's parallel ops use (whose threads spin after them, or
    sleep under OMP_WAIT_POLICY=PASSIVE): no thread started or stopped, the bits of one thread; a short
    call stays on the kernels' own pool."""
    monkeypatch.setenv("OMP_WAIT_POLICY", wait_policy)  # read by the subprocess's OpenMP runtime
    counts = printed_counts(run_script(OPENMP_SCRIPT))
    assert counts["short"] == [0, 2, 0]  # the pool: the caller and the kernels' worker
    if counts["gnu openmp"] == [1]:  # torch's wheels
        assert counts["long"] == [1, 2, 0]  # torch's team of two; its worker neither released nor restarted
        assert counts["torch again"] == [0]


def test_long_and_short_calls_from_several_threads_at_once_give_their_bits(restore_threads):
    """Python threads calling at once: long calls each on a team of their own, short ones on the pool or
    alone; every result has the bits of its one-thread run."""
    import threading

    blocks, hidden = 2, 1024
    long_tokens = long_call_tokens(blocks, hidden)
    cases = [make_inputs(tokens, blocks, hidden, seed=10 + tokens) for tokens in (long_tokens, long_tokens + 8, 24)]
    torch.set_num_threads(1)
    expected = [forward_on(inputs, 4)[0] for inputs in cases]
    torch.set_num_threads(2)
    calls_before = native.torch_team_calls()
    start = threading.Barrier(len(cases))
    mismatches = []

    def caller(index):
        start.wait()
        for _ in range(4):
            if not torch.equal(forward_on(cases[index], 4)[0].view(torch.int32), expected[index].view(torch.int32)):
                mismatches.append(index)

    threads = [threading.Thread(target=caller, args=(index,)) for index in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a call hung"
    assert mismatches == []
    if gnu_openmp_loaded():  # torch's wheels
        assert native.torch_team_calls() - calls_before == 8  # the long calls, not the short ones


FLUSH_SCRIPT = """
    import torch
    from conftest import make_inputs
    from test_kernel_threads import forward_on, gnu_openmp_loaded, long_call_tokens
    from attnres_ge.op_kernel import native

    blocks, hidden = 2, 1024
    tokens = long_call_tokens(blocks, hidden)
    if not {long}:
        tokens //= 8
    partial, block_res, proj, norm = make_inputs(tokens, blocks, hidden, seed=9)
    inputs = (partial * 1e-39, block_res * 1e-39, proj, norm)  # float32 subnormals
    torch.set_num_threads(1)
    plain = forward_on(inputs, 8)[0]
    assert torch.set_flush_denormal(True)  # the calling thread's flush-to-zero and denormals-are-zero
    expected = forward_on(inputs, 8)[0]
    torch.set_num_threads(2)
    calls = native.torch_team_calls()
    outputs = forward_on(inputs, 8)[0]
    print("team calls:", native.torch_team_calls() - calls)
    print("flushing changes the bits:", int(not torch.equal(plain.view(torch.int32), expected.view(torch.int32))))
    print("same bits on two threads:", int(torch.equal(outputs.view(torch.int32), expected.view(torch.int32))))
    print("gnu openmp:", int(gnu_openmp_loaded()))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the loaded libraries from /proc (Linux)")
@pytest.mark.parametrize("long", [True, False], ids=["long-call-torch-team", "short-call-own-pool"])
def test_every_thread_runs_with_the_callers_floating_point_environment(long):
    """Flush-to-zero set on the calling thread holds for every task, on torch's team and on the pool."""
    counts = printed_counts(run_script(FLUSH_SCRIPT.format(long=long)))
    assert counts["flushing changes the bits"] == [1]  # the inputs can tell
    assert counts["same bits on two threads"] == [1]
    if not long:
        assert counts["team calls"] == [0]
    elif counts["gnu openmp"] == [1]:
        assert counts["team calls"] == [1]


FORK_AFTER_TEAM_SCRIPT = """
    import os
    import torch
    from conftest import make_inputs
    from test_kernel_threads import forward_on, long_call_tokens
    from attnres_ge.op_kernel import native

    torch.set_num_threads(2)
    blocks, hidden = 2, 1024
    tokens = long_call_tokens(blocks, hidden)
    inputs = make_inputs(tokens, blocks, hidden, seed=8)
    torch.arange(1 << 20, dtype=torch.float32).sum()  # torch's OpenMP team
    expected = forward_on(inputs, 2)[0]  # runs on it: the child inherits a team
    calls = native.torch_team_calls()
    pid = os.fork()
    if pid == 0:  # libgomp's team here is the parent's: a parallel region would wait forever
        # (as would any parallel torch op here, torch.equal's too: the bits are compared in numpy)
        same = forward_on(inputs, 2)[0].numpy().tobytes() == expected.numpy().tobytes()
        os._exit(0 if same and native.torch_team_calls() == calls else 3)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
"""

# A multiprocessing worker forked before the library was imported (the parent used torch's threads).
FORKED_WORKER_SCRIPT = """
    import multiprocessing
    import torch

    torch.set_num_threads(2)
    blocks, hidden, tokens = 2, 1024, 16 * 1024  # 2 ** 28 bytes: long for any plausible threshold
    inputs = (torch.randn(tokens, hidden), torch.randn(tokens, blocks, hidden), torch.randn(1, hidden) / 32,
              torch.ones(hidden))
    torch.arange(1 << 20, dtype=torch.float32).sum()  # torch's OpenMP team, before the library is loaded

    def worker(results):  # no parallel torch op here: the OpenMP team is the parent's
        from test_kernel_threads import forward_on
        from attnres_ge.op_kernel import native

        assert (blocks + 2) * tokens * hidden * 4 >= native.openmp_team_min_bytes(2)
        forward_on(inputs, 2)
        results.put(native.torch_team_calls())

    if __name__ == "__main__":
        context = multiprocessing.get_context("fork")
        results = context.SimpleQueue()
        process = context.Process(target=worker, args=(results,))
        process.start()
        process.join()
        print("child exit", process.exitcode, "team calls", results.get() if process.exitcode == 0 else None)
"""


@pytest.mark.parametrize("script", [FORK_AFTER_TEAM_SCRIPT, FORKED_WORKER_SCRIPT],
                         ids=["os.fork-after-import", "multiprocessing-fork-before-import"])
def test_a_forked_child_leaves_its_parents_openmp_team_alone(script):
    result = run_script(script)
    assert result.returncode == 0, result.stderr
    assert "child exit 0" in result.stdout, result.stdout + result.stderr
    if "team calls" in result.stdout:
        assert result.stdout.split("team calls ")[1].split()[0] == "0"
