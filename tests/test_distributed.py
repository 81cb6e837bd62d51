"""DDP and FSDP2 (two CPU processes, gloo) train a model with BlockAttnRes, a layer alone or a language model on a
ResidualStream: the same gradients as one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["layer", "stream"])
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_data_parallel_gradients_match_one_process(wrapper, kind, tmp_path):
    worker = Path(__file__).with_name("distributed_worker.py")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}  # the kernels' threads: one per process
    result = subprocess.run([sys.executable, str(worker), str(tmp_path / "rendezvous"), wrapper, kind],
                            capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-12000:]}"
    assert f"{wrapper} {kind}: gradients match" in result.stdout
