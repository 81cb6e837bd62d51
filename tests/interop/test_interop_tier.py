"""The tier's own setup: always collected, so a machine without torch_npu reports a skip with the reason."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture
def torchair(interop_unavailable):
    if interop_unavailable:
        pytest.skip(f"interop tier skipped: {interop_unavailable}")
    return sys.modules["torchair"]


def test_torchair_is_the_one_inside_the_torch_npu_wheel(torchair):
    assert Path(torchair.__file__).parent.parent.name == "dynamo"
    assert Path(torchair.__file__).parent.parent.parent.name == "torch_npu"


def test_torch_npu_itself_is_not_imported(torchair):
    assert "torch_npu" not in sys.modules and os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


def test_torch_is_the_version_torch_npu_pins(torchair):
    import torch

    assert torch.__version__.split("+")[0] == "2.13.0"


def test_the_native_module_is_our_stand_in(torchair):
    import torchair_standin
    from torchair.core import _backend

    assert sys.modules["torchair.core._torchair"].get_registered_ir_def is torchair_standin.get_registered_ir_def
    assert _backend._torchair is sys.modules["torchair.core._torchair"]
