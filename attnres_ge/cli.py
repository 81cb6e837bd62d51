"""The `attnres-ge` command: demo, training comparison, benchmark, tiling decisions, prototype export."""

from __future__ import annotations

import argparse
import sys

import torch

from attnres_ge.shapes import DTYPES, parse_shape


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


def cmd_tiling(args) -> int:
    from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
    from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
    from attnres_ge.op_host.platform import HOST_SOC, PlatformInfo, profile_by_name
    from attnres_ge.op_kernel import describe_implementation

    tokens, blocks, hidden = args.shape
    profile = profile_by_name(args.soc)
    platform = PlatformInfo(profile, filled=not args.cold, runtime=lambda: profile)
    dtype = DTYPES[args.dtype]
    if args.op == "forward":
        info = forward_tiling.parse(platform)
        result = forward_tiling.tiling(info, tokens, blocks, hidden, dtype, args.norm_eps, args.need_backward,
                                       platform)
    else:
        info = grad_tiling.parse(platform)
        result = grad_tiling.tiling(info, tokens, blocks, hidden, dtype, platform)
    print(f"op             {info.op_type}")
    print(f"platform       {profile.soc}: {profile.vector_core_num} vector cores, {profile.ub_size} bytes buffer each"
          + (" (handle empty at TilingParse, re-queried at Tiling)" if args.cold else ""))
    print(f"shape          T={tokens} N={blocks} H={hidden} {args.dtype}")
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

    tiling = commands.add_parser("tiling", help="print the tiling decision for one shape")
    tiling.add_argument("--op", choices=("forward", "backward"), required=True,
                        help="BlockAttentionResiduals (forward) or BlockAttentionResidualsGrad (backward)")
    tiling.add_argument("--soc", default="host",
                        help="platform profile: host (this CPU: its usable cores and L2 per core; default) "
                        "or Ascend910B2")
    tiling.add_argument("--shape", type=parse_shape, required=True, metavar="T,N,H",
                        help="tokens, blocks and hidden size, e.g. 4096,8,2048")
    tiling.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the value inputs")
    tiling.add_argument("--need-backward", action="store_true", help="forward: also write inv_norm and probs")
    tiling.add_argument("--norm-eps", type=float, default=1e-6, help="the RMS norm's epsilon (default: 1e-6)")
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
