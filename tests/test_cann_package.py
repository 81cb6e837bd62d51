"""What the CANN custom op package is built from, checked without an Ascend toolkit.

- The REG_OP headers export-proto generates compile (g++ -fsyntax-only) against CANN's own
  graph/operator_reg.h from the CANN source kit, and declare every input, output and attribute
  of the Python prototypes with the attribute types GE reads.
- The backward's header equals upstream's hand-written op_graph prototype; the msopgen JSON of
  both ops equals upstream's OpDefs (names, order, presence, paired dtype/format columns,
  attribute types and defaults).
- cann_package/cmake/attnres_inputs.cmake (what the package build runs first) takes every *.cpp in
  op_proto/cann/ and op_host/cann/ (sorted), which names every registration of every op, and compiles
  exactly the generated headers.

The kit is found at env CANN_SRC (relative paths from the repository root), default
../shared/cann-src; without it, or without g++/cmake, these tests skip with a message, except in
CI (env CI set), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnres_ge.ge_plugin.ops import OPS
from attnres_ge.op_proto.export import JSON_NAME, export_prototypes, msopgen_op, op_stem, proto_header_name

PROTOTYPES = {op.op_type: op.prototype for op in OPS}

REPO_ROOT = Path(__file__).resolve().parents[1]
KIT = REPO_ROOT / os.environ.get("CANN_SRC", "../shared/cann-src")
INPUTS_SCRIPT = REPO_ROOT / "cann_package" / "cmake" / "attnres_inputs.cmake"
CANN_FOLDERS = ("op_proto/cann", "op_host/cann")  # the C++ registrations: every *.cpp in them is built
UPSTREAM_OPS = Path("upstream") / "ops-transformer" / "mhc"
UPSTREAM_TWO_PHASE_OPS = Path("upstream") / "two-phase" / "attention"  # BlockAttnResPrepare / Update
GETTER_TYPES = {"Int": "int64_t", "Float": "float", "Bool": "bool"}  # GE's OpInt, OpFloat, OpBool


def require(available: bool, missing: str) -> None:
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{missing}; CI must run this test")
    pytest.skip(missing)


@pytest.fixture(scope="module")
def kit() -> Path:
    require((KIT / "include_dirs.txt").is_file(), f"no CANN source kit at {KIT} (set CANN_SRC)")
    return KIT


@pytest.fixture(scope="module")
def gxx() -> str:
    compiler = shutil.which("g++")
    require(compiler is not None, "no g++ on PATH")
    return compiler


@pytest.fixture(scope="module")
def cmake() -> str:
    program = shutil.which("cmake")
    require(program is not None, "no cmake on PATH")
    return program


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """op type -> its generated REG_OP header."""
    *headers, _ = export_prototypes(PROTOTYPES.values(), tmp_path_factory.mktemp("proto"))
    return {op_type: header for op_type in PROTOTYPES for header in headers
            if header.name == proto_header_name(op_type)}


def syntax_check(gxx: str, kit: Path, source: Path, *include_dirs: Path) -> None:
    kit_dirs = [line.strip() for line in (kit / "include_dirs.txt").read_text().splitlines() if line.strip()]
    command = [gxx, "-std=c++17", "-fsyntax-only", "-DOS_TYPE=0", *(f"-I{kit / d}" for d in kit_dirs),
               *(f"-I{d}" for d in include_dirs), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{source.name} does not compile against the kit:\n{result.stderr[-4000:]}"


def prototype_use(op_type: str) -> str:
    """C++ that names every input, output and attribute accessor REG_OP must have generated for the op."""
    proto, cls = PROTOTYPES[op_type], f"ge::op::{op_type}"
    lines = [f"void Use{op_type}() {{", f'  {cls} op("{op_stem(op_type)}");']
    lines += [f"  (void){cls}::name_in_{arg.name}();" for arg in proto.inputs]
    lines += [f"  (void){cls}::name_out_{arg.name}();" for arg in proto.outputs]
    lines += [f"  static_assert(std::is_same<decltype(op.get_attr_{attr.name}()), {GETTER_TYPES[attr.kind]}>::value,"
              f' "{attr.name} must be {attr.kind}");' for attr in proto.attrs]
    return "\n".join(lines + ["}"])


def test_generated_headers_compile_against_cann_operator_reg(exported, kit, gxx, tmp_path):
    includes = "".join(f'#include "{header.name}"\n' for header in exported.values())
    uses = "\n\n".join(prototype_use(op_type) for op_type in exported)
    check = tmp_path / "generated_proto_check.cpp"
    check.write_text(f"#include <cstdint>\n#include <type_traits>\n{includes}\n{uses}\n")
    syntax_check(gxx, kit, check, next(iter(exported.values())).parent)


REG_OP_ENTRY = re.compile(
    r"\.(INPUT|OPTIONAL_INPUT|DYNAMIC_INPUT|OUTPUT|DYNAMIC_OUTPUT)\((\w+),\s*TensorType\(\{([^}]*)\}\)\)"
    r"|\.(ATTR|REQUIRED_ATTR)\((\w+),\s*(\w+)(?:,\s*([^)]*))?\)"
)


def parse_reg_op(text: str, op_type: str) -> list[tuple]:
    """The REG_OP block of `op_type` as ordered entries: (macro, name, dtypes) or (macro, name, kind, default)."""
    match = re.search(rf"REG_OP\({op_type}\)(.*?)\.OP_END_FACTORY_REG\({op_type}\)", text, re.S)
    assert match, f"no REG_OP({op_type}) block"
    entries = []
    for tensor_macro, tensor, dtypes, attr_macro, attr, kind, default in REG_OP_ENTRY.findall(match.group(1)):
        if tensor_macro:
            entries.append((tensor_macro, tensor, [d.strip() for d in dtypes.split(",")]))
        else:
            entries.append((attr_macro, attr, kind, default.strip()))
    return entries


def test_grad_header_equals_upstream_prototype(exported, kit):
    op_type = "BlockAttentionResidualsGrad"
    stem = op_stem(op_type)
    upstream = (kit / UPSTREAM_OPS / stem / "op_graph" / f"{stem}_proto.h").read_text()
    ours = parse_reg_op(exported[op_type].read_text(), op_type)
    assert ours == parse_reg_op(upstream, op_type)
    assert len(ours) == 12, "7 inputs, 4 outputs, 1 attribute"


OPDEF_TENSOR = re.compile(
    r'this->(Input|Output)\("(\w+)"\)\s*\.ParamType\((\w+)\)\s*\.DataType\(\{([^}]*)\}\)\s*\.(Format|FormatList)\(\{([^}]*)\}\)'
)
OPDEF_ATTR = re.compile(r'this->Attr\("(\w+)"\)\s*\.AttrType\((\w+)\)\s*\.(\w+)\(([^)]*)\)')
OPDEF_DTYPES = {"ge::DT_BF16": "bfloat16", "ge::DT_FLOAT16": "float16", "ge::DT_FLOAT": "float",
                "ge::DT_UINT64": "uint64"}
OPDEF_CONSTANT = re.compile(r"constexpr\s+\w+\s+(\w+)\s*=\s*([^;]+);")  # a default may be named (DEFAULT_EPS)


def parse_opdef(text: str) -> dict:
    """An OpDef class as msopgen JSON would state it: tensors with dtype/format columns, attributes."""

    def listed(text):
        return [item.strip() for item in text.split(",")]

    parsed = {"Input": [], "Output": [], "attr": []}
    for role, name, presence, dtypes, format_call, formats in OPDEF_TENSOR.findall(text):
        formats = [f.removeprefix("ge::FORMAT_") for f in listed(formats)]
        if format_call == "FormatList":  # every format with every dtype: one format, one column per dtype
            assert len(formats) == 1, f"{name}: FormatList of {len(formats)} formats is not parsed here"
            formats = formats * len(listed(dtypes))
        parsed[role].append({"name": name, "param_type": presence.lower(), "format": formats,
                             "type": [OPDEF_DTYPES[d] for d in listed(dtypes)]})
    constants = dict(OPDEF_CONSTANT.findall(text))
    for name, presence, kind, default in OPDEF_ATTR.findall(text):
        default = constants.get(default.strip(), default)
        parsed["attr"].append((name, presence.lower(), kind.lower(), default_value(kind.lower(), default)))
    return parsed


def default_value(kind: str, text: str):
    text = text.strip()
    return {"float": lambda: float(text.rstrip("fF")), "int": lambda: int(text),
            "bool": lambda: {"true": True, "false": False}[text]}[kind]()


@pytest.mark.parametrize("op_type", sorted(PROTOTYPES))
def test_msopgen_json_equals_upstream_opdef(kit, op_type):
    stem = op_stem(op_type)
    folder = UPSTREAM_TWO_PHASE_OPS if stem.startswith("block_attn_res_") else UPSTREAM_OPS
    upstream = parse_opdef((kit / folder / stem / "op_host" / f"{stem}_def.cpp").read_text())
    ours = msopgen_op(PROTOTYPES[op_type])
    assert ours["input_desc"] == upstream["Input"]
    assert ours["output_desc"] == upstream["Output"]
    assert [(a["name"], a["param_type"], a["type"], default_value(a["type"], a["default_value"]))
            for a in ours["attr"]] == upstream["attr"]


def derived_sources(root: Path) -> list[str]:
    """The C++ registrations under `root` as the package build derives them: every *.cpp of CANN_FOLDERS, sorted."""
    paths = (path for folder in CANN_FOLDERS for path in (root / folder).glob("*.cpp"))
    return sorted(path.relative_to(root).as_posix() for path in paths)


def source_list() -> list[str]:
    listed = derived_sources(REPO_ROOT)
    if not listed:
        pytest.skip(f"no *.cpp in {' or '.join(CANN_FOLDERS)}: the C++ registrations are not in this tree yet")
    return listed


def run_inputs_script(cmake: str, repo_root: Path, out_dir: Path) -> subprocess.CompletedProcess:
    command = [cmake, f"-DATTNRES_REPO_ROOT={repo_root}", f"-DATTNRES_OUT_DIR={out_dir}",
               f"-DATTNRES_PYTHON={sys.executable}", "-P", str(INPUTS_SCRIPT)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


# BlockAttnResUpdate keeps CANN's own tiling (docs/ascend.md): the package registers its OpDef and InferShape only.
CANN_TILING_KEPT = {"BlockAttnResUpdate"}


def test_source_list_names_every_registration_of_every_op():
    listed = set(source_list())
    for op_type in PROTOTYPES:
        stem = op_stem(op_type)
        paths = [f"op_host/cann/{stem}_def.cpp", f"op_proto/cann/{stem}_infershape.cpp"]
        if op_type not in CANN_TILING_KEPT:
            paths.append(f"op_host/cann/{stem}_tiling.cpp")
        for path in paths:
            assert path in listed, f"{op_type}: {path} is missing"
    assert "op_host/cann/block_attn_res_update_tiling.cpp" not in listed


def test_package_inputs_resolve_and_include_the_generated_headers(cmake, kit, gxx, tmp_path):
    listed = source_list()
    result = run_inputs_script(cmake, REPO_ROOT, tmp_path / "inputs")
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = (tmp_path / "inputs" / "host_sources.txt").read_text().split()
    assert resolved == [str(REPO_ROOT / path) for path in listed]
    assert all(Path(path).is_file() for path in resolved)

    translation_unit = (tmp_path / "inputs" / "attnres_ge_op_proto.cc").read_text()
    included = re.findall(r'#include "([^"]+)"', translation_unit)
    expected = sorted(proto_header_name(op_type) for op_type in PROTOTYPES)
    assert included == expected
    reference = {path.name: path.read_text() for path in export_prototypes(PROTOTYPES.values(), tmp_path / "reference")}
    for name in included:
        assert (tmp_path / "inputs" / name).read_text() == reference[name], f"{name} differs from export-proto's"
    syntax_check(gxx, kit, tmp_path / "inputs" / "attnres_ge_op_proto.cc", tmp_path / "inputs")


def test_package_inputs_take_every_cpp_of_the_cann_folders_and_refuse_none(cmake, tmp_path):
    root = tmp_path / "repo"
    for folder in ("op_proto/cann", "op_host/cann", "op_host/cann/nested"):
        (root / folder).mkdir(parents=True)
    taken = ["op_host/cann/a_def.cpp", "op_host/cann/z_tiling.cpp", "op_proto/cann/b_infershape.cpp"]
    left = ["op_host/cann/a_tiling.h", "op_host/cann/nested/x.cpp", "op_host/top.cpp", "op_host/b_tiling.py"]
    for path in taken + left:
        (root / path).write_text("// present\n")
    assert derived_sources(root) == taken
    result = run_inputs_script(cmake, root, tmp_path / "ok")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "ok" / "host_sources.txt").read_text().split() == [str(root / path) for path in taken]
    assert (tmp_path / "ok" / JSON_NAME).is_file()

    for path in taken:
        (root / path).unlink()
    result = run_inputs_script(cmake, root, tmp_path / "none")
    assert result.returncode != 0
    assert "attnres: no C++ registrations (*.cpp)" in result.stderr
