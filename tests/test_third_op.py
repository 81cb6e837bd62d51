"""A third op added without editing shared code (docs/architecture.md, "How to add an op"): tests/third_op/scaled_add.py
writes each layer's piece and appends its registry entry; eager calls, fake tensors, the torch.compile
backend (converter, local GE, launcher) and validation then work for it as for the two Block AttnRes ops.
In a fresh process with the Python kernels, since the op has no native kernel and its torch op stays
defined for the life of the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch

    import attnres_ge
    sys.path.insert(0, sys.argv[1])
    import scaled_add
    from attnres_ge.op_proto import AttnResInputError

    x, y = torch.randn(6, 40), torch.randn(6, 40)
    expected = torch.add(x, y, alpha=0.5)
    assert torch.equal(torch.ops.attnres.scaled_add(x, y, 0.5), expected), "eager"

    backend = attnres_ge.ge_backend(dump_path=sys.argv[2])
    compiled = torch.compile(lambda a, b: torch.ops.attnres.scaled_add(a, b, 0.5) * 2, backend=backend)
    assert torch.equal(compiled(x, y), expected * 2), "graph"
    dumps = list(Path(sys.argv[2]).glob("*.pbtxt"))
    assert any('type: "ScaledAdd"' in path.read_text() for path in dumps), "no GE graph held the op"

    try:
        torch.ops.attnres.scaled_add(x, y[:, :8])
    except AttnResInputError as error:
        assert "ScaledAdd" in str(error) and "y" in str(error), error
    else:
        raise AssertionError("a bad shape was accepted")
    print("third op ok")
    """
)


def test_a_third_op_needs_only_its_own_files_and_a_registry_entry(tmp_path):
    env = dict(os.environ, ATTNRES_GE_KERNEL="python")
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE / "third_op"), str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "third op ok" in result.stdout
