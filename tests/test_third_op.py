"""A new op is its own files plus one entry in the op registry and one line in the list of native ops
(docs/architecture.md, "How to add an op").

In a copy of the repository, the toy op ScaledAdd (z = x + alpha * y; tests/third_op/scaled_add/, laid out
as the layers are) is dropped into op_proto/, op_host/, op_kernel/ and op_kernel/csrc/, its entry is added
to ge_plugin/ops.py and its launch header to op_kernel/csrc/native_op_list.h; git then shows those two
files as the only ones edited. The copy's native kernels are built (unoptimised, to be quick) and, in a
fresh process of that copy, everything that iterates the registry picks the op up: the native kernels
(the op runs on its own, with the bits of its Python kernel), its torch op (schema, eager and fake
implementations derived from the prototype), the converter and the local GE under torch.compile,
validation, the CLI's `tiling` and `export-proto`, and the benchmark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attnres_ge

REPO = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "third_op" / "scaled_add"
REGISTRY = "ge_plugin/ops.py"
NATIVE_LIST = "op_kernel/csrc/native_op_list.h"
# The op's lines in the two lists, by file: each inserted after the line that starts with its key.
TOY_ENTRY = '    TorchOp(scaled_add.KERNEL, "scaled_add", bench_inputs=scaled_add.bench_inputs),'
ENTRY_LINES = {
    REGISTRY: {
        "from attnres_ge.op_kernel.block_attn_res_update import": "from attnres_ge.op_kernel import scaled_add",
        "    BLOCK_ATTN_RES_UPDATE,": TOY_ENTRY,
    },
    NATIVE_LIST: {'#include "block_attn_res_update_launch.h"': '#include "scaled_add_launch.h"'},
}

SCRIPT = textwrap.dedent(
    """
    import io
    import sys
    from contextlib import redirect_stdout
    from pathlib import Path

    import torch

    import attnres_ge
    from attnres_ge import cli
    from attnres_ge.op_proto import AttnResInputError

    from attnres_ge.op_kernel import _native, describe_implementation

    assert Path(attnres_ge.__file__).resolve().is_relative_to(Path.cwd()), attnres_ge.__file__
    assert Path(_native.__file__).resolve().is_relative_to(Path.cwd()), _native.__file__
    assert "ScaledAdd" in _native.record_layouts(), "the native module has no ScaledAdd"
    assert describe_implementation().startswith("native"), describe_implementation()
    x, y = torch.randn(6, 40), torch.randn(6, 40)
    expected = torch.add(x, y, alpha=0.5)
    assert torch.equal(torch.ops.attnres.scaled_add(x, y, 0.5), expected), "eager"
    assert torch.equal(torch.ops.attnres.scaled_add(x, y, alpha=0.5), expected), "eager, attribute by name"

    backend = attnres_ge.ge_backend(dump_path=sys.argv[1])
    compiled = torch.compile(lambda a, b: torch.ops.attnres.scaled_add(a, b, 0.5) * 2, backend=backend)
    assert torch.equal(compiled(x, y), expected * 2), "graph"
    dumps = list(Path(sys.argv[1]).glob("*.pbtxt"))
    assert any('type: "ScaledAdd"' in path.read_text() for path in dumps), "no GE graph held the op"

    try:
        torch.ops.attnres.scaled_add(x, y[:, :8])
    except AttnResInputError as error:
        assert "ScaledAdd" in str(error) and "y" in str(error), error
    else:
        raise AssertionError("a bad shape was accepted")

    def cli_output(*argv):
        out = io.StringIO()
        with redirect_stdout(out):
            assert cli.main(list(argv)) == 0, argv
        return out.getvalue()

    tiling = cli_output("tiling", "--op", "scaled_add", "--shape", "T=6,H=40", "--attr", "alpha=0.25")
    assert "op             ScaledAdd" in tiling and "alpha                0.25" in tiling, tiling
    assert "scaled_add_proto.h" in cli_output("export-proto", "--out", sys.argv[1])
    assert "scaled_add" in cli_output("bench", "--list")
    bench = cli_output("bench", "--ops", "scaled_add", "--dtypes", "float32", "--rounds", "3", "--retries", "0")
    assert "scaled_add" in bench and "op-eager" in bench and "op-graph" in bench, bench
    print("third op ok")
    """
)


def copy_of_repository(destination: Path) -> None:
    """The repository's tracked files (and its built extensions, which git ignores), committed in a new git
    repository at `destination`."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    built = [path.relative_to(REPO) for folder in ("op_kernel", "ge_plugin") for path in (REPO / folder).glob("*.so")]
    for relative in [*tracked.stdout.split("\0"), *map(str, built)]:
        if relative and (REPO / relative).is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / relative, destination / relative)
    git(destination, "init", "-q")
    git(destination, "add", "-A")
    git(destination, "commit", "-q", "-m", "the repository as it is")


def git(where: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args]
    return subprocess.run(command, cwd=where, capture_output=True, text=True, check=True).stdout


def add_the_toy_op(repository: Path) -> None:
    """Its own files into their layers, its entry into the registry: nothing else."""
    for source in TOY.rglob("*"):
        if source.is_file() and "__pycache__" not in source.parts:
            target = repository / source.relative_to(TOY)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for path, entries in ENTRY_LINES.items():
        lines = (repository / path).read_text().splitlines()
        for key, entry in entries.items():
            (index,) = [i for i, line in enumerate(lines) if line.startswith(key)]
            lines.insert(index + 1, entry)
        (repository / path).write_text("\n".join(lines) + "\n")


def build_native_kernels(repository: Path) -> None:
    """op_kernel/_native of the copy, from its sources with setup.py's flags but unoptimised (seconds, not minutes)
    and without the read's kernels (placeholders in their place: block_attn_res_read_args.h), which the script
    never calls and which made the build about half again as long."""
    csrc, objects = repository / "op_kernel" / "csrc", repository / "build" / "native"
    objects.mkdir(parents=True)
    flags = ["-std=c++17", "-O0", "-fPIC", "-pthread", "-ffp-contract=off", "-DATTNRES_TEST_WITHOUT_READ_KERNELS",
             f"-I{csrc}", f"-I{sysconfig.get_paths()['include']}"]

    def compile_one(source: Path) -> Path:
        target = objects / f"{source.stem}.o"
        run_checked(["g++", *flags, "-c", str(source), "-o", str(target)])
        return target

    with ThreadPoolExecutor(max_workers=2) as pool:  # every .cpp there: setup.py's SOURCES
        built = list(pool.map(compile_one, sorted(csrc.glob("*.cpp"))))
    module = repository / "op_kernel" / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    module.unlink(missing_ok=True)
    run_checked(["g++", "-shared", "-pthread", *map(str, built), "-o", str(module)])


def run_checked(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr[-3000:]}"


def installed_from_a_wheel() -> bool:
    """True when the attnres_ge under test is an installed wheel, which a copy of the repository cannot
    replace (attnres_ge/_checkout.py loads the installed copy in its place)."""
    return (Path(attnres_ge.__file__).resolve().parent / "ge_plugin").is_dir()


@pytest.mark.skipif(installed_from_a_wheel(), reason="needs the package from a checkout (make test-main runs it)")
def test_a_new_op_is_its_own_files_and_one_registry_entry(tmp_path):
    repository = tmp_path / "repository"
    copy_of_repository(repository)
    add_the_toy_op(repository)

    changed = sorted(git(repository, "status", "--porcelain", "--untracked-files=all").splitlines())
    new_files = sorted(f"?? {path.relative_to(TOY).as_posix()}" for path in TOY.rglob("*") if path.is_file()
                       and "__pycache__" not in path.parts)
    assert changed == sorted([f" M {REGISTRY}", f" M {NATIVE_LIST}", *new_files])
    for path, entries in ENTRY_LINES.items():
        diff = git(repository, "diff", "--unified=0", path).splitlines()
        edits = [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert edits == [f"+{entry}" for entry in entries.values()]

    build_native_kernels(repository)
    env = dict(os.environ, ATTNRES_GE_KERNEL="native")
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out")], cwd=repository, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "third op ok" in result.stdout
