"""The NPU kernels warm their device up once per process before the first CANN op, on CPU.

No `npu` device is registered (that would break torch.compile for the process): the kernels
from make_npu_kernel run on CPU tensors, with stand-ins for CANN's two torch ops that record
when they are called, and a dispatch mode that records which aten ops ran on which device.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch
from conftest import make_inputs
from torch.utils._python_dispatch import TorchDispatchMode

from attnres_ge.ge_plugin import npu

T, N, H = 4, 2, 8


class RecordOps(TorchDispatchMode):
    """Appends (aten op name, device) of every op dispatched while active to `events`."""

    def __init__(self, events: list):
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        devices = {t.device.type for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)}
        self.events.append((func.overloadpacket.__name__, tuple(sorted(devices))))
        return result


def standin_cann_ops(events: list):
    """Stand-ins for torch.ops.cann_ops_transformer's forward and backward: record the call and its arguments."""

    def cann_forward(*args):
        events.append(("cann_forward", args[4:]))
        return "forward-result"

    def cann_backward(*args, valid_block_num):
        events.append(("cann_backward", valid_block_num))
        return "backward-result"

    return cann_forward, cann_backward


@pytest.fixture
def fresh_process(monkeypatch):
    """A process in which no device has been warmed up yet."""
    monkeypatch.setattr(npu, "_warmed_devices", set())


def backward_inputs():
    inputs = make_inputs(T, N, H)
    return (*inputs, torch.ones(T, H), torch.ones(T, N + 1), torch.full((T, N + 1), 1 / (N + 1)))


def test_first_call_runs_a_small_op_on_the_device_once_then_cann(fresh_process):
    events = []
    forward, backward = (npu.make_npu_kernel(op) for op in standin_cann_ops(events))
    forward_args, backward_args = make_inputs(T, N, H), backward_inputs()
    with RecordOps(events):
        assert backward(*backward_args, valid_block_num=0) == "backward-result"
        assert forward(*forward_args, -1, 1e-6, True) == "forward-result"
        assert backward(*backward_args, valid_block_num=0) == "backward-result"
    cann_calls = [i for i, (name, _) in enumerate(events) if name.startswith("cann_")]
    aten_ops = [i for i, (name, _) in enumerate(events) if not name.startswith("cann_")]
    assert [events[i] for i in aten_ops] == [("ones", ("cpu",)), ("add_", ("cpu",))], (
        "one small op ran on the inputs' device, once per process")
    assert max(aten_ops) < min(cann_calls), "the warm-up ran before the first CANN op"
    assert [events[i] for i in cann_calls] == [("cann_backward", 0), ("cann_forward", (-1, 1e-6, True)),
                                               ("cann_backward", 0)], "CANN's ops get the arguments unchanged"


def test_concurrent_first_calls_warm_up_once_and_wait_for_it(fresh_process, monkeypatch):
    """Eight threads making their first call at once: one warm-up, finished before any CANN op starts."""
    log, lock = [], threading.Lock()

    def slow_small_op(device):
        with lock:
            log.append(("warm-up start", device))
        time.sleep(0.05)  # widens the window in which a second thread could slip past
        with lock:
            log.append(("warm-up end", device))

    def cann_backward(*args, valid_block_num):
        with lock:
            log.append(("cann", args[0].device))

    monkeypatch.setattr(npu, "_run_small_op", slow_small_op)
    backward = npu.make_npu_kernel(cann_backward)
    inputs = backward_inputs()
    threads = [threading.Thread(target=backward, args=inputs, kwargs={"valid_block_num": 0}) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    cpu = torch.device("cpu")
    assert log[:2] == [("warm-up start", cpu), ("warm-up end", cpu)]
    assert log[2:] == [("cann", cpu)] * 8


def test_each_device_is_warmed_up_once(fresh_process, monkeypatch):
    warmed = []
    monkeypatch.setattr(npu, "_run_small_op", warmed.append)
    for device in ("cpu", "meta", "cpu", "meta"):
        npu.warm_up_device(torch.device(device))
    assert warmed == [torch.device("cpu"), torch.device("meta")]


def test_no_npu_kernels_without_torch_npu(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert npu.register_npu_kernels() is False


def test_update_norm_on_an_npu_is_cann_update_then_the_norm_in_float32():
    """CANN has no fused update + norm: its update's h (bfloat16, as CANN's OpDef gives it) is normed in float32."""
    h = torch.randn(T, H).bfloat16()
    calls = []

    def cann_update(*args, eps):
        calls.append((len(args), eps))
        return h

    weight = torch.randn(H)
    normed = npu.update_then_norm(cann_update)(*[None] * 6, weight, eps=1e-5, output_eps=1e-3)
    assert calls == [(6, 1e-5)]
    expected = torch.nn.functional.rms_norm(h.float(), (H,), weight, 1e-3).bfloat16()
    assert normed.dtype == torch.bfloat16 and torch.equal(normed, expected)
