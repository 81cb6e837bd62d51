"""The `attnres-ge` command: demo, training comparison, benchmark, tiling decisions, prototype export."""

from __future__ import annotations

import argparse
import sys

import torch

from attnres_ge.shapes import DTYPES, parse_dims


def cmd_demo(args) -> int:
    """The main job: one layer checked against float64, eager and graph training side by side, then generation
    with the eagerly trained model."""
    from attnres_ge.examples import eager_check, generate, train

    status = eager_check.main()
    print()
    runs = train.main(["--steps", str(args.steps)])
    print()
    generate.main(["--new-tokens", "8"], model=runs["eager"].model)
    return status


def cmd_train(args) -> int:
    from attnres_ge.examples import train

    train.main(["--steps", str(args.steps), "--seed", str(args.seed)])
    return 0


# The Block AttnRes pair by their old short names (`--op forward`, `--op backward`).
TILING_ALIASES = {"forward": "block_attention_residuals", "backward": "block_attention_residuals_backward"}
TILING_WHERE = "attnres-ge tiling"  # where a shape or attribute was rejected, in the prototype's messages


def tiling_attrs(proto, args) -> dict:
    """The attributes given by --attr NAME=VALUE, --norm-eps and --need-backward, typed by the prototype."""
    kinds = {attr.name: attr.kind for attr in proto.attrs}
    given = dict(item.split("=", 1) if "=" in item else (item, "") for item in args.attr)
    if args.norm_eps is not None:
        given["norm_eps"] = args.norm_eps
    if args.need_backward:
        given["need_backward"] = "true"
    unknown = sorted(set(given) - set(kinds))
    if unknown:
        raise ValueError(f"{proto.op_type} has no attribute {', '.join(unknown)}; its attributes: {sorted(kinds)}")
    return {name: ATTR_PARSERS[kinds[name]](str(value)) for name, value in given.items()}


def _parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "1", "false", "0"):
        raise ValueError(f"a Bool attribute takes true or false, got {text!r}")
    return text.lower() in ("true", "1")


ATTR_PARSERS = {"Int": int, "Float": float, "Bool": _parse_bool, "Str": str}


def cmd_tiling(args) -> int:
    from attnres_ge.ge_plugin.ops import op_named
    from attnres_ge.op_host.platform import HOST_SOC, PlatformInfo, profile_by_name
    from attnres_ge.op_kernel import describe_implementation
    from attnres_ge.op_kernel.launcher import HostRuntime

    try:
        op = op_named(TILING_ALIASES.get(args.op, args.op))
    except KeyError as error:
        raise ValueError(error.args[0]) from None
    proto = op.prototype
    profile = profile_by_name(args.soc)
    platform = PlatformInfo(profile, filled=not args.cold, runtime=lambda: profile)
    metas = proto.example_metas(args.shape, DTYPES[args.dtype], TILING_WHERE)
    attrs, _ = proto.check(metas, tiling_attrs(proto, args), TILING_WHERE)
    result = HostRuntime(platform).tiling(op.kernel, metas, attrs)  # TilingParse, then Tiling
    print(f"op             {op.op_type}")
    print(f"platform       {profile.soc}: {profile.vector_core_num} vector cores, {profile.ub_size} bytes buffer each"
          + (" (handle empty at TilingParse, re-queried at Tiling)" if args.cold else ""))
    shape = " ".join(f"{letter}={args.shape[letter]}" for letter in proto.letters())
    print(f"shape          {shape} {args.dtype}")
    if profile.soc == HOST_SOC:
        print(f"cpu kernels    {describe_implementation()}, at most {torch.get_num_threads()} threads "
              "(torch.get_num_threads())")
    print(result.describe())
    return 0


def cmd_export_proto(args) -> int:
    from attnres_ge.ge_plugin.ops import OPS
    from attnres_ge.op_proto.export import export_prototypes

    for path in export_prototypes([op.prototype for op in OPS], args.out):
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnres-ge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="one layer checked against float64, eager vs graph training, generation")
    demo.add_argument("--steps", type=int, default=8, help="training steps per mode (default: 8)")
    demo.set_defaults(run=cmd_demo)

    train = commands.add_parser("train", help="train the example model in eager and graph mode, side by side")
    train.add_argument("--steps", type=int, default=8, help="training steps per mode (default: 8)")
    train.add_argument("--seed", type=int, default=0, help="seed of the model's weights and data (default: 0)")
    train.set_defaults(run=cmd_train)

    tiling = commands.add_parser("tiling", help="print the tiling decision of one op for one shape")
    tiling.add_argument("--op", required=True, metavar="OP",
                        help="an op by torch name or GE type (attnres-ge bench --list lists them), or forward "
                        "(BlockAttentionResiduals) or backward (BlockAttentionResidualsGrad)")
    tiling.add_argument("--soc", default="host",
                        help="platform profile: host (this CPU: its usable cores and L2 per core; default) "
                        "or Ascend910B2")
    tiling.add_argument("--shape", type=parse_dims, required=True, metavar="T,N,H | L=SIZE,...",
                        help="tokens, blocks and hidden size, e.g. 4096,8,2048; or each letter of the op's "
                        "layouts, e.g. T=4096,N=8,S=2,D=2048")
    tiling.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the value inputs")
    tiling.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE", help="an attribute of the op")
    tiling.add_argument("--need-backward", action="store_true", help="forward: also write inv_norm and probs")
    tiling.add_argument("--norm-eps", type=float, default=None, help="forward: the RMS norm's epsilon (default 1e-6)")
    tiling.add_argument("--cold", action="store_true", help="platform handle empty at TilingParse (cold start)")
    tiling.set_defaults(run=cmd_tiling)

    # Listed for --help; main() hands `bench ...` to attnres_ge.bench, which parses its own options.
    commands.add_parser("bench", help="speed against a paired copy and PyTorch (see attnres-ge bench -h)")

    export = commands.add_parser("export-proto", help="write the REG_OP header and msopgen JSON")
    export.add_argument("--out", required=True, metavar="DIR", help="folder to write the two files into")
    export.set_defaults(run=cmd_export_proto)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from attnres_ge import bench

        return bench.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as error:
        print(f"attnres-ge {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
