"""The eager path's huge-page output pool (ge_plugin/csrc/huge_page_pool.h): reuse only memory no tensor
uses any more."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from conftest import make_inputs
from test_buffer_reuse import HOLDERS, keep_view

from attnres_ge.ge_plugin import cpp_entry
from attnres_ge.op_kernel import host_memory
from attnres_ge.op_kernel.host_memory import HUGE_PAGE

pytestmark = pytest.mark.skipif(cpp_entry.MODULE is None, reason="the C++ entry, which holds the pool, is not built")

SHAPE = (1024, 1024, 2)  # 8 MiB of float32
UNCAPPED = 1 << 40


def make_pool(max_idle_bytes: int = UNCAPPED):
    return cpp_entry.MODULE.HugePagePool(max_idle_bytes)


def test_a_mapping_is_reused_only_after_every_tensor_and_view_is_gone():
    pool = make_pool()
    first = pool.empty(SHAPE, torch.float32)
    first.fill_(7.0)
    view = first[1:3]
    del first
    second = pool.empty(SHAPE, torch.float32)
    assert pool.mapped == 2, "a live view must keep its mapping out of reuse"
    assert torch.all(view == 7.0), "the live view's values must survive the next allocation"
    del view
    third = pool.empty(SHAPE, torch.float32)
    assert pool.mapped == 2, "once nothing uses it, the mapping is handed out again"
    assert third.shape == SHAPE and third.is_contiguous() and third.dtype == torch.float32
    del second, third


@pytest.mark.parametrize("holder", HOLDERS, ids=lambda holder: holder.__name__)
def test_every_way_of_holding_an_output_keeps_it_intact(holder):
    """The holders of the graph buffers' test (tests/test_buffer_reuse.py), on the eager pool."""
    pool = make_pool()
    first = pool.empty(SHAPE, torch.float32)
    first.copy_(torch.arange(first.numel(), dtype=torch.float32).view(SHAPE))
    snapshot = first.clone()
    read = holder(first)
    del first
    gc.collect()
    pool.empty(SHAPE, torch.float32).fill_(-1.0)  # reuses the mapping only if nothing can reach it
    kept = read()
    if kept is not None:
        assert torch.equal(kept, snapshot[1:] if holder is keep_view else snapshot)


def test_a_tensor_saved_by_autograd_keeps_its_mapping():
    pool = make_pool()
    saved = pool.empty(SHAPE, torch.float32).fill_(1.0)
    leaf = torch.ones(SHAPE, requires_grad=True)
    product = leaf * saved  # autograd saves `saved` for the backward
    pointer = saved.data_ptr()
    del saved
    other = pool.empty(SHAPE, torch.float32)
    assert other.data_ptr() != pointer
    other.fill_(5.0)
    product.sum().backward()
    assert torch.all(leaf.grad == 1.0)


def test_a_tensor_outlives_the_pool_object_that_made_it():
    pool = make_pool()
    kept = pool.empty(SHAPE, torch.float32).fill_(3.0)
    del pool  # the mapping's deleter holds the pool: it goes with the last tensor
    gc.collect()
    assert torch.all(kept == 3.0)
    del kept


def test_idle_mappings_beyond_the_cap_are_unmapped_as_they_come_back():
    pool = make_pool(max_idle_bytes=HUGE_PAGE * 4)
    tensors = [pool.empty(SHAPE, torch.float32) for _ in range(3)]  # 4 huge pages each
    assert pool.in_use_bytes() == 3 * 4 * HUGE_PAGE and pool.idle_bytes() == 0
    del tensors
    assert pool.in_use_bytes() == 0 and pool.idle_bytes() == 4 * HUGE_PAGE, "one kept for reuse, two unmapped"


def test_a_mapping_larger_than_the_cap_stays_while_smaller_ones_come_and_go():
    """An output larger than the whole cap (prepare's numerator at D=7168) is reused call after call, while the
    smaller outputs of the calls between (the updates') are held to the cap as ever."""
    pool = make_pool(max_idle_bytes=HUGE_PAGE * 4)
    large_shape = (2 * SHAPE[0], *SHAPE[1:])  # 8 huge pages: twice the cap
    large = pool.empty(large_shape, torch.float32)
    del large
    assert pool.idle_bytes() == 8 * HUGE_PAGE, "the large mapping stays"
    smalls = [pool.empty(SHAPE, torch.float32) for _ in range(2)]  # 4 huge pages each
    del smalls
    assert pool.idle_bytes() == (8 + 4) * HUGE_PAGE, "one small mapping kept under the cap, beside the large one"
    mapped = pool.mapped
    again = pool.empty(large_shape, torch.float32)
    assert pool.mapped == mapped and pool.idle_bytes() == 4 * HUGE_PAGE, "the next output of its size took it"
    larger = pool.empty((3 * SHAPE[0], *SHAPE[1:]), torch.float32)  # 12 huge pages
    del again  # the large mapping idle again, beside the small one
    assert pool.idle_bytes() == (8 + 4) * HUGE_PAGE
    del larger
    assert pool.idle_bytes() == 12 * HUGE_PAGE, "only the newest of the mappings above the cap stays"


def test_the_idle_cap_holds_after_a_threaded_burst():
    cap = 24 * HUGE_PAGE
    pool = make_pool(max_idle_bytes=cap)
    start = threading.Barrier(6)
    wrong_sizes = []  # an assert in a thread would not fail the test

    def burst(worker):
        start.wait()
        for round_ in range(12):
            sizes = [(4 + (worker + round_ + step) % 5) * HUGE_PAGE for step in range(3)]  # untouched: no memory
            held = [pool.empty((size // 4,), torch.float32) for size in sizes]
            wrong_sizes.extend(tensor.numel() * 4 for tensor, size in zip(held, sizes, strict=True)
                               if tensor.numel() * 4 != size)

    threads = [threading.Thread(target=burst, args=(worker,)) for worker in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong_sizes
    assert pool.mapped > cap // (8 * HUGE_PAGE), "the burst mapped more than the cap holds"
    assert pool.in_use_bytes() == 0
    assert 0 < pool.idle_bytes() <= cap, f"{pool.idle_bytes() >> 20} MiB idle after the burst, cap {cap >> 20} MiB"


@pytest.fixture
def own_output_pool():
    """Eager outputs of MIN_HUGE_BYTES or more from a pool of this test's (whatever this machine's THP mode)."""
    pool = make_pool()
    previous = cpp_entry.MODULE.use_output_pool(pool, host_memory.MIN_HUGE_BYTES)
    try:
        yield pool
    finally:
        cpp_entry.MODULE.use_output_pool(*previous)


def test_eager_outputs_come_from_the_pool_and_stay_correct(own_output_pool):
    pool = own_output_pool
    inputs = make_inputs(64, 4, 8192)  # hidden_states: 2 MiB, grad_block_res: 8 MiB
    expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    held = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    again = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    for a, b, c in zip(expected, held, again, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert pool.mapped == 0, "outputs below MIN_HUGE_BYTES come from torch's allocator"
    _, inv_norm, probs = expected
    grads = torch.ops.attnres.block_attention_residuals_backward(*inputs, torch.ones(64, 8192), inv_norm, probs)
    assert pool.mapped == 1, "the 8 MiB gradient comes from the pool"
    first_grad = grads[1].clone()
    grads_again = torch.ops.attnres.block_attention_residuals_backward(*inputs, torch.ones(64, 8192), inv_norm, probs)
    assert torch.equal(grads[1], first_grad), "a held output is never reused under its holder"
    assert grads_again[1].data_ptr() != grads[1].data_ptr() and pool.mapped == 2
    del grads, grads_again
    torch.ops.attnres.block_attention_residuals_backward(*inputs, torch.ones(64, 8192), inv_norm, probs)
    assert pool.mapped == 2, "a repeat takes a mapping no tensor uses any more"


@pytest.mark.parametrize("value", ["0", "false"])
def test_switch_off(monkeypatch, value):
    monkeypatch.setenv(host_memory.HUGE_PAGES_ENV, value)
    host_memory.huge_pages_available.cache_clear()
    try:
        assert not host_memory.huge_pages_available() and host_memory.huge_page_min_bytes() == 0
    finally:
        host_memory.huge_pages_available.cache_clear()
