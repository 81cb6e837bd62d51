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


def test_torch_is_the_release_torch_npu_is_built_for(torchair):
    """torch_npu pins torch to its own release (2.13.0 requires 2.13.0.*). CI installs torch_npu 2.14.0 with
    --no-deps over torch 2.14.1 (2.14.0 is not on our machines' disk): the one difference allowed."""
    from importlib.metadata import version

    import torch

    pair = (version("torch_npu").split("+")[0], torch.__version__.split("+")[0])
    assert pair in {("2.13.0", "2.13.0"), ("2.14.0", "2.14.1")}, f"torch_npu {pair[0]} over torch {pair[1]}"


def test_the_native_module_is_our_stand_in(torchair):
    import torchair_standin
    from torchair.core import _backend

    assert sys.modules["torchair.core._torchair"].get_registered_ir_def is torchair_standin.get_registered_ir_def
    assert _backend._torchair is sys.modules["torchair.core._torchair"]
