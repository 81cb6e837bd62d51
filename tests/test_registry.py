"""The op registry (ge_plugin/ops.py) and the native side agree: every op has its native kernel, whose
C++ tiling record is the Python record's to_bytes() field for field; what disagrees is refused."""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import pytest
import torch

from attnres_ge import ge_plugin
from attnres_ge.ge_plugin import cpp_entry
from attnres_ge.ge_plugin.converters import local_converters
from attnres_ge.ge_plugin.ops import OPS, op_for_type
from attnres_ge.op_host.block_attention_residuals_tiling import ForwardTilingData
from attnres_ge.op_host.tiling_base import TilingRecord

native = pytest.importorskip("attnres_ge.op_kernel.native", reason="the native kernels are not built")


def test_every_registered_op_has_a_torch_op_a_converter_and_the_native_kernel_it_declares():
    converters = local_converters()
    # Every op's native kernel is registered under its op type, and only those (OpKernel.has_native).
    assert set(native._native.record_layouts()) == {op.op_type for op in OPS if op.kernel.has_native}
    for op in OPS:
        overload = getattr(torch.ops.attnres, op.name).default
        assert overload in converters, f"{op.name} has no converter"
        if op.kernel.has_native:
            assert native._native.record_layouts()[op.op_type] == op.kernel.tiling.record.field_layout()


def test_unknown_op_type_names_the_known_ones():
    with pytest.raises(KeyError, match="BlockAttentionResidualsGrad"):
        op_for_type("BlockAttentionResidualsGradGrad")


def swapped_forward_record() -> type[TilingRecord]:
    """ForwardTilingData's fields with the first two swapped: the same bytes, another meaning."""
    fields = [(field.name, field.type) for field in dataclasses.fields(ForwardTilingData)]
    fields[0], fields[1] = fields[1], fields[0]
    return dataclasses.make_dataclass("SwappedForwardRecord", fields, bases=(TilingRecord,), frozen=True)


def test_a_record_that_disagrees_with_the_cpp_struct_is_refused():
    swapped = swapped_forward_record()
    assert swapped.field_layout()[0] == ForwardTilingData.field_layout()[0]
    record = swapped(2, 4, 3, 32, 1, 0, 4, 4, 1, 32, 1, 32, 1, 1e-6)
    with pytest.raises(RuntimeError, match="does not match SwappedForwardRecord"):
        native.launch_record("BlockAttentionResiduals", record, torch.float32)


def test_bytes_of_the_wrong_length_or_op_are_refused():
    with pytest.raises(ValueError, match="a tiling record has 108 bytes, got 10"):
        native._native.make_launch("BlockAttentionResiduals", 0, b"\0" * 10, 0)
    with pytest.raises(ValueError, match="no native op Nope"):
        native._native.make_launch("Nope", 0, b"", 0)


def test_a_record_that_does_not_cover_the_tokens_is_refused():
    record = ForwardTilingData(10, 2, 3, 32, 2, 0, 4, 4, 1, 32, 1, 32, 1, 1e-6)  # 2 cores x 4 tokens != 10
    with pytest.raises(ValueError, match="does not cover 10 items exactly"):
        native.launch_record("BlockAttentionResiduals", record, torch.float32)


@pytest.mark.parametrize("constant", ["LANES", "DTYPE_CODES"])
def test_a_build_with_other_constants_is_refused(monkeypatch, constant):
    if constant == "LANES":
        monkeypatch.setattr(native, "LANES", 8)
    else:
        monkeypatch.setattr(native, "DTYPE_CODES", {torch.float32: 0, torch.float16: 2, torch.bfloat16: 1})
    with pytest.raises(ImportError, match="built from other sources.*rebuild"):
        native._check_shared_constants()


def test_a_cpp_entry_built_from_other_sources_is_not_used(monkeypatch):
    """A failed rebuild leaves the previous extension in place: it is set aside with a warning, not called."""
    stale = SimpleNamespace(__file__="_cpp_entry.so", install=lambda *args: None)  # no INTERFACE_VERSION
    monkeypatch.setitem(sys.modules, "attnres_ge.ge_plugin._cpp_entry", stale)
    monkeypatch.setattr(ge_plugin, "_cpp_entry", stale, raising=False)
    with pytest.warns(RuntimeWarning, match="built from other sources and is not used"):
        assert cpp_entry._load() is None


def test_a_native_build_without_the_record_interface_is_refused(monkeypatch):
    monkeypatch.setattr(native, "_native", SimpleNamespace(LANES=16))  # an older build: no DTYPE_CODES
    with pytest.raises(ImportError, match="built from other sources"):
        native._check_shared_constants()
