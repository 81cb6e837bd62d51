"""The exported REG_OP header and msopgen JSON match the declarations; the CLI works."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch

from attnres_ge.cli import main
from attnres_ge.ge_plugin.ops import OPS
from attnres_ge.op_host import platform
from attnres_ge.op_host.platform import PlatformProfile
from attnres_ge.op_proto import FLOAT_DTYPES
from attnres_ge.op_proto.export import GE_DTYPES, JSON_NAME, MSOPGEN_DTYPES, export_prototypes, proto_header_name

PROTOTYPES = {op.op_type: op.prototype for op in OPS}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """({op type: its REG_OP header text}, the msopgen JSON)."""
    *headers, op_json = export_prototypes(PROTOTYPES.values(), tmp_path_factory.mktemp("proto"))
    by_op = {op_type: path.read_text() for op_type in PROTOTYPES for path in headers
             if path.name == proto_header_name(op_type)}
    return by_op, json.loads(op_json.read_text())


def reg_op_block(header: str, op_type: str) -> list[str]:
    match = re.search(rf"REG_OP\({op_type}\)\n(.*?)\.OP_END_FACTORY_REG\({op_type}\)", header, re.S)
    assert match, f"no REG_OP({op_type}) block"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


@pytest.mark.parametrize("op_type", sorted(PROTOTYPES))
def test_reg_op_lists_every_declared_input_output_and_attr_in_order(exported, op_type):
    proto = PROTOTYPES[op_type]
    expected = []
    # REG_OP has no optional output: the forward's optional inv_norm/probs are OUTPUTs there.
    for macro, args in (("INPUT", proto.inputs), ("OUTPUT", proto.outputs)):
        for arg in args:
            types = ", ".join(GE_DTYPES[d] for d in arg.dtypes)
            expected.append(f".{macro}({arg.name}, TensorType({{{types}}}))")
    valid_block_num = {"BlockAttentionResiduals": "-1", "BlockAttentionResidualsGrad": "0"}.get(op_type)
    defaults = {"valid_block_num": valid_block_num, "norm_eps": "1e-06", "need_backward": "false", "eps": "1e-06"}
    expected += [f".ATTR({attr.name}, {attr.kind}, {defaults[attr.name]})" for attr in proto.attrs]
    assert reg_op_block(exported[0][op_type], op_type) == expected


@pytest.mark.parametrize("op_type", sorted(PROTOTYPES))
def test_each_header_holds_exactly_its_op(exported, op_type):
    header = exported[0][op_type]
    assert re.findall(r"REG_OP\((\w+)\)", header) == [op_type]
    assert header.count("#include") == 1 and '#include "graph/operator_reg.h"' in header


@pytest.mark.parametrize("op_type", sorted(PROTOTYPES))
def test_msopgen_json_matches_the_declaration(exported, op_type):
    proto = PROTOTYPES[op_type]
    (entry,) = [op for op in exported[1] if op["op"] == op_type]
    width = max(len(arg.dtypes) for arg in (*proto.inputs, *proto.outputs))  # 3 for the training pair, else 1
    for key, args in (("input_desc", proto.inputs), ("output_desc", proto.outputs)):
        assert [d["name"] for d in entry[key]] == [a.name for a in args]
        for desc, arg in zip(entry[key], args, strict=True):
            assert desc["param_type"] == arg.presence
            assert set(desc["type"]) == {MSOPGEN_DTYPES[d] for d in arg.dtypes}
            assert desc["format"] == ["ND"] * width, "every tensor lists one format per dtype column"
            assert len(desc["type"]) == width, "every tensor lists one dtype per column"
    assert [(a["name"], a["type"], a["param_type"]) for a in entry["attr"]] == [
        (a.name, a.kind.lower(), "optional") for a in proto.attrs
    ]


def test_forward_declaration_follows_spec():
    proto = PROTOTYPES["BlockAttentionResiduals"]
    assert proto.input_names() == ["partial_block", "block_res", "proj_weight", "norm_weight"]
    assert proto.output_names() == ["hidden_states", "inv_norm", "probs"]
    assert [(a.name, a.kind, a.default) for a in proto.attrs] == [
        ("valid_block_num", "Int", -1), ("norm_eps", "Float", 1e-6), ("need_backward", "Bool", False)]
    assert proto.outputs[1].dtypes == proto.outputs[2].dtypes == (torch.float32,)
    assert [arg.presence for arg in proto.outputs] == ["required", "optional", "optional"]


@pytest.mark.parametrize("op_type", ["BlockAttentionResiduals", "BlockAttentionResidualsGrad"])
def test_msopgen_columns_pair_each_dtype_combination(exported, op_type):
    """Column j of every tensor is one combination: the op's dtype, with the statistics in float32."""
    (entry,) = [op for op in exported[1] if op["op"] == op_type]
    descs = entry["input_desc"] + entry["output_desc"]
    combinations = list(zip(*(d["type"] for d in descs), strict=True))
    statistics = {"inv_norm", "probs"}
    follows = [i for i, d in enumerate(descs) if d["name"] not in statistics]
    fixed = [i for i, d in enumerate(descs) if d["name"] in statistics]
    assert sorted(c[follows[0]] for c in combinations) == ["bfloat16", "float", "float16"]
    for combination in combinations:
        assert {combination[i] for i in follows} == {combination[follows[0]]}
        assert {combination[i] for i in fixed} == {"float"}


def test_dtype_columns_refuse_a_tensor_with_a_partial_dtype_list():
    proto = PROTOTYPES["BlockAttentionResidualsGrad"]
    broken = dataclasses.replace(proto, inputs=(dataclasses.replace(proto.inputs[0], dtypes=FLOAT_DTYPES[:2]),
                                                *proto.inputs[1:]))
    with pytest.raises(ValueError, match="partial_block declares 2 dtypes; expected 1 or 3"):
        broken.dtype_columns()


def test_backward_declaration_follows_spec():
    proto = PROTOTYPES["BlockAttentionResidualsGrad"]
    assert proto.input_names() == ["partial_block", "block_res", "proj_weight", "norm_weight", "grad_hidden_states",
                                   "inv_norm", "probs"]
    assert proto.output_names() == ["grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight"]
    assert [(a.name, a.kind, a.default) for a in proto.attrs] == [("valid_block_num", "Int", 0)]


def test_cli_export_proto(tmp_path, capsys):
    assert main(["export-proto", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [JSON_NAME, "block_attention_residuals_grad_proto.h",
                                                          "block_attention_residuals_proto.h",
                                                          "block_attn_res_prepare_proto.h",
                                                          "block_attn_res_update_proto.h"]
    assert "wrote" in capsys.readouterr().out


def test_cli_tiling_prints_the_decision(capsys, monkeypatch):
    # The CLI tiles for the host profile; pinning that profile to a generic 48-core platform keeps the expectation
    # independent of this machine.
    monkeypatch.setitem(platform.PROFILES, "host", lambda: PlatformProfile("generic-48", 48, 196608))
    assert main(["tiling", "--op", "backward", "--shape", "4096,8,2048", "--cold"]) == 0
    out = capsys.readouterr().out
    assert "BlockAttentionResidualsGrad" in out and "block_dim      48" in out
    assert "workspace_size 524288 bytes" in out and "re-queried at Tiling" in out


def test_cli_tiling_on_the_host_names_the_kernel_path(capsys):
    assert main(["tiling", "--op", "forward", "--shape", "64,4,256"]) == 0
    out = capsys.readouterr().out
    assert "platform       host-cpu" in out and "cpu kernels    " in out


def test_cli_tiling_reports_bad_arguments(capsys):
    assert main(["tiling", "--op", "forward", "--soc", "tpu9", "--shape", "1,1,1"]) == 2
    assert "unknown platform profile 'tpu9'; known: ['host']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tiling", "--op", "forward", "--shape", "1,1"])


@pytest.mark.parametrize("soc", ["Ascend910B2", "ascend910_93"])
def test_cli_tiling_sends_ascend_socs_to_the_cpp_registrations(capsys, soc):
    assert main(["tiling", "--op", "backward", "--soc", soc, "--shape", "4096,8,2048"]) == 2
    err = capsys.readouterr().err
    assert f"{soc!r} is an Ascend SoC" in err
    assert "C++ registrations (op_host/cann/*_tiling.cpp)" in err and "make cann-host" in err


@pytest.mark.slow
def test_cli_demo_runs_as_installed_command():
    result = subprocess.run([sys.executable, "-m", "attnres_ge.cli", "demo"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "all within the tolerances of docs/contract.md" in result.stdout
    assert result.stdout.count(" ok") == 15
    assert "tiling data" not in result.stdout  # the tiling is attnres-ge tiling's to show


def test_demo_check_gives_its_verdict_and_points_to_the_tiling(capsys):
    """The demo's numerics check: one line per tensor and dtype, the verdict, and where the tiling is shown,
    but not the tiling records themselves (nor their bytes)."""
    from attnres_ge.examples import eager_check

    assert eager_check.main() == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 15 and "FAIL" not in out
    assert "all within the tolerances of docs/contract.md" in out
    assert "attnres-ge tiling --op forward --shape 256,4,512" in out
    assert "tiling_key" not in out and "tiling data" not in out


def test_cli_tiling_takes_every_registry_op_by_its_letters(capsys):
    shape = ["--shape", "T=64,N=4,S=2,D=256"]
    assert main(["tiling", "--op", "block_attn_res_prepare", *shape, "--attr", "eps=1e-5"]) == 0
    out = capsys.readouterr().out
    assert "op             BlockAttnResPrepare" in out and "shape          T=64 N=4 D=256 S=2 float32" in out
    assert "  eps                  1e-05" in out
    assert main(["tiling", "--op", "BlockAttnResUpdate", "--shape", "64,4,256"]) == 2
    err = capsys.readouterr().err
    assert "BlockAttnResUpdate (attnres-ge tiling): the input layouts use dims T, D; missing D" in err
    assert main(["tiling", "--op", "forward", "--shape", "64,4,256", "--attr", "eps=1"]) == 2
    assert "BlockAttentionResiduals has no attribute eps" in capsys.readouterr().err
    assert main(["tiling", "--op", "no_such_op", "--shape", "64,4,256"]) == 2
    assert "no op named 'no_such_op'; known: ['block_attention_residuals'" in capsys.readouterr().err
