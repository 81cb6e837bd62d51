"""DDP and FSDP2 (two CPU processes, gloo) train a model with BlockAttnRes: the same gradients as one process."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_data_parallel_gradients_match_one_process(wrapper):
    worker = Path(__file__).with_name("distributed_worker.py")
    result = subprocess.run([sys.executable, str(worker), str(_free_port()), wrapper], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{wrapper}: gradients match" in result.stdout
