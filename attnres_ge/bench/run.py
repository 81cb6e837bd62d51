"""`attnres-ge bench`'s command line and run: which shapes, dtypes, providers and paths, timed family by family,
then the report (printed, --json, --plot)."""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import asdict

import torch

from attnres_ge.bench.cases import registry
from attnres_ge.bench.cases.block import BLOCK_PROVIDERS, BlockCase
from attnres_ge.bench.cases.model import MODEL_PROVIDERS, MODEL_ROUNDS, ModelCase
from attnres_ge.bench.cases.op import OP_PROVIDERS, OpCase, timed_dtypes
from attnres_ge.bench.cases.per_layer import OUR_PROVIDERS, PROVIDERS, measure
from attnres_ge.bench.cases.read import READ_PROVIDERS, ReadCase, timed_providers
from attnres_ge.bench.cases.stream import STREAM_PROVIDERS, StreamCase
from attnres_ge.bench.cases.two_phase import TWO_PHASE_PROVIDERS, TwoPhaseCase
from attnres_ge.bench.harness import Measurement, measure_case
from attnres_ge.bench.overheads import OVERHEAD_ROUNDS, call_overheads, overhead_lines
from attnres_ge.bench.paths import (
    ALL_PATHS,
    kernel_path,
    kernel_threads,
    on_path,
    op_path,
    paths_to_time,
    two_phase_path,
)
from attnres_ge.bench.plot import plot
from attnres_ge.bench.report import (
    block_rows,
    block_table,
    goal_rows,
    goal_table,
    machine,
    model_rows,
    model_table,
    read_goal_rows,
    read_goal_table,
    speedups,
)
from attnres_ge.shapes import DTYPES, parse_shape

DESCRIPTION = ("`attnres-ge bench`: Block AttnRes against a paired copy and against PyTorch, side by side in one "
               "process.")
ALL_PROVIDERS = (*PROVIDERS, *TWO_PHASE_PROVIDERS, *BLOCK_PROVIDERS, *STREAM_PROVIDERS,
                 *READ_PROVIDERS, *MODEL_PROVIDERS)  # OP_PROVIDERS among them
# The families timed float32 only, at their named shapes: case type and providers.
SUITES = {"two-phase": (TwoPhaseCase, TWO_PHASE_PROVIDERS), "block": (BlockCase, BLOCK_PROVIDERS),
          "stream": (StreamCase, STREAM_PROVIDERS)}


def named_shape(text: str) -> tuple[str, tuple[int, int, int]]:
    """`T,N,H` -> ("T{T}_N{N}_H{H}", (T, N, H)); the forward needs T, N and H of at least 1."""
    tokens, blocks, hidden = parse_shape(text)
    if min(tokens, blocks, hidden) < 1:
        raise argparse.ArgumentTypeError(f"bench --shape needs T, N and H of at least 1, got {text!r}")
    return f"T{tokens}_N{blocks}_H{hidden}", (tokens, blocks, hidden)


def chosen_names(args: argparse.Namespace, shapes: dict[str, dict[str, tuple[int, ...]]]) -> list[str]:
    """The named shapes of the run: --shapes; else, when --shape or --ops says what to time, the --ops' defaults;
    else every family's and generic op's defaults; --all-blocks adds every block shape."""
    if args.shapes:
        names = list(args.shapes)
    elif args.shape or args.ops:
        names = [name for op in args.ops or () for name in registry.defaults(op, shapes[op])]
    else:
        names = [name for owner, named in shapes.items() for name in registry.defaults(owner, named)]
    if args.all_blocks:
        names += list(shapes["block"])
    return names


def select_shapes(args: argparse.Namespace) -> dict[str, tuple[int, int, int]]:
    """The per-layer op's shapes of the run (named ones and --shape); sets args.suite_shapes (two-phase, block,
    stream: their named shapes of the run), args.read_shapes and args.model_shapes (the read's and the
    inkling2-model's named shapes of the run) and args.op_shapes (generic op -> its named shapes of the run, only
    the --ops where given). ValueError for an --ops name the generic family does not time."""
    shapes = registry.all_shapes()
    generic = registry.generic_ops()
    unknown = [name for name in args.ops or () if name not in generic]
    if unknown:
        raise ValueError(f"--ops: {', '.join(unknown)} not timed by the generic family; it times "
                         f"{', '.join(generic) or 'none (no registry op sets bench_inputs)'}")
    names = chosen_names(args, shapes)

    def picked(owner: str) -> dict[str, tuple[int, ...]]:
        return {name: shapes[owner][name] for name in names if name in shapes[owner]}

    args.suite_shapes = {family: picked(family) for family in SUITES}
    args.read_shapes = picked("read")
    args.model_shapes = picked("inkling2-model")
    args.op_shapes = {op: picked(op) for op in generic if not args.ops or op in args.ops}
    selected = picked("per-layer")
    selected.update(args.shape)
    return selected


def build_parser() -> argparse.ArgumentParser:
    shapes = registry.all_shapes()
    per_layer, two_phase, streams, reads, models = (", ".join(shapes[family]) for family in
                                                    ("per-layer", "two-phase", "stream", "read", "inkling2-model"))
    parser = argparse.ArgumentParser(prog="attnres-ge bench", description=DESCRIPTION)
    parser.add_argument("--shapes", nargs="+", default=None, metavar="NAME",
                        choices=[name for named in shapes.values() for name in named],
                        help=f"named shapes to time: the per-layer op's {per_layer} (T_N_H); the two-phase ops' "
                             f"{two_phase} (T_N_S_D); blocks block_T{{4096,16,1}}_N{{8,32}}_D{{2048,7168}}_"
                             f"R{registry.BLOCK_READS}; the stream's {streams} (T_D_layers_layers per block); the "
                             f"general read's {reads} (T_N_H_S); a tiny Inkling2 model's {models} (P_T_D_L_B: "
                             f"tokens cached, tokens fed, hidden, layers, layers per block); a registry op's (see "
                             f"--list) (default: all per-layer, two-phase, stream, read and model shapes, the blocks "
                             f"{', '.join(registry.DEFAULT_SHAPES['block'])} and the registry ops' shapes, unless "
                             f"--shape or --ops is given)")
    parser.add_argument("--all-blocks", action="store_true",
                        help=f"also time every block shape ({len(shapes['block'])}), not only the chosen ones")
    parser.add_argument("--shape", action="append", type=named_shape, default=[], metavar="T,N,H",
                        help="a shape of your own (tokens, blocks, hidden); repeat for several")
    parser.add_argument("--ops", nargs="+", default=None, metavar="NAME",
                        help="registry ops (torch op names) the generic family times, at their default shapes "
                             "unless --shapes names some (default: every one it can; see --list)")
    parser.add_argument("--list", action="store_true",
                        help="print the named shapes and the ops the bench times, one per line, and stop")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES),
                        help="dtypes to time (default: float32 bfloat16)")
    parser.add_argument("--providers", nargs="+", default=list(ALL_PROVIDERS), choices=list(ALL_PROVIDERS),
                        metavar="PROVIDER", help=f"what to time: the per-layer op's {', '.join(PROVIDERS)}; the "
                                                 f"two-phase ops' {', '.join(TWO_PHASE_PROVIDERS)}; a block's "
                                                 f"{', '.join(BLOCK_PROVIDERS)}; the stream's "
                                                 f"{', '.join(STREAM_PROVIDERS)}; the general read's "
                                                 f"{', '.join(READ_PROVIDERS)}; the Inkling2 model's "
                                                 f"{', '.join(MODEL_PROVIDERS)}; a registry op's "
                                                 f"{', '.join(OP_PROVIDERS)} (default: all)")
    parser.add_argument("--paths", nargs="+", default=None, metavar="PATH",
                        help="instruction set paths of the native kernels to time, one after the other in this run "
                             f"(scalar, avx2, avx512, avx512bf16, or {ALL_PATHS}: every path this CPU runs; "
                             "default: the path the kernels run on)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="timed rounds per measurement (default: 7 for large shapes, 101 for small ones, "
                             f"{MODEL_ROUNDS} for the Inkling2 model)")
    parser.add_argument("--retries", type=int, default=2,
                        help="times disturbed rounds are run again before the measurement is flagged (default: 2)")
    parser.add_argument("--overhead-rounds", type=int, default=OVERHEAD_ROUNDS,
                        help=f"paired rounds for the per-call overheads of short kernels (default: {OVERHEAD_ROUNDS})")
    parser.add_argument("--json", metavar="FILE", help="write the measurements, speedups and machine here")
    parser.add_argument("--plot", metavar="FILE",
                        help="write a PNG here: milliseconds, speedup over PyTorch and %% of copy (needs matplotlib)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import attnres_ge  # noqa: F401  (registers the torch ops; the registry's ops are the bench's too)

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(registry.listing()))
        return 0
    try:
        shapes = select_shapes(args)
        paths = paths_to_time(args.paths)
    except ValueError as error:
        parser.error(str(error))
    about = machine()
    print(f"machine: {about}")
    results, overheads, blocks = [], [], []
    for index, path in enumerate(paths or [None]):
        path_results, path_overheads, path_blocks = on_path(path, functools.partial(time_cases, shapes, args,
                                                                                       index > 0))
        results += path_results
        overheads += path_overheads
        blocks += path_blocks
    report(results, overheads, blocks, shapes, args, about)
    return 0


def report(results: list[Measurement], overheads: list[dict], blocks: list[dict],
           shapes: dict[str, tuple[int, int, int]], args: argparse.Namespace, about: dict) -> None:
    """What closes a run: speedups, flagged measurements, overheads, goal and block tables, --json, --plot."""
    ratios = speedups(results)
    for row in ratios:
        if row["provider"] in OUR_PROVIDERS and row["against"] not in OUR_PROVIDERS:
            print(f"  {row['path']} {row['shape']} {row['dtype']} {row['direction']}: {row['provider']} "
                  f"{row['speedup']:.2f}x vs {row['against']}")
    flagged = [m for m in results if not m.trusted]
    if flagged:
        print(f"{len(flagged)} measurement(s) stayed disturbed after {args.retries} rerun(s) and are not results: "
              + ", ".join(f"{m.path} {m.shape} {m.dtype} {m.provider} {m.direction}" for m in flagged))
    for line in overhead_lines(overheads):
        print(line)
    goals = goal_rows(results, shapes)
    if goals:
        print("\n".join(goal_table(goals)))
    read_goals = read_goal_rows(results, args.read_shapes)
    if read_goals:
        print("\n".join(read_goal_table(read_goals)))
    if blocks:
        print("\n".join(block_table(blocks)))
    models = model_rows(results, args.model_shapes)
    if models:
        print("\n".join(model_table(models)))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": about, "results": [{**asdict(m), "trusted": m.trusted} for m in results],
                       "speedups": ratios, "overheads": overheads, "goals": goals, "read_goals": read_goals,
                       "blocks": blocks, "models": models}, handle,
                      indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {args.plot}" if plot(results, args.plot) else "--plot needs matplotlib; no chart written")


def time_cases(shapes: dict[str, tuple[int, int, int]], args: argparse.Namespace,
               later_path: bool = False) -> tuple[list[Measurement], list[dict], list[dict]]:
    """Every shape and dtype of the run on the kernels as they run now: the measurements, the per-call overheads
    of the short ones, and the block rows (block_rows). On a later path of --paths the two-phase ops, the
    generic ops, the read and the Inkling2 model are not timed again while they run Python kernels (the path does
    not change them)."""
    from attnres_ge.op_kernel import describe_implementation

    print(f"kernels: {describe_implementation()}, {kernel_threads()} kernel threads, "
          f"{torch.get_num_threads()} torch threads; two-phase kernels: {two_phase_path()}")
    results = []
    providers = [name for name in args.providers if name in PROVIDERS]
    for shape_name, shape in shapes.items() if providers else ():
        rounds = rounds_for(shape[0] * shape[1] * shape[2], args)
        for dtype_name in args.dtypes:
            print(f"{shape_name} {dtype_name} ({rounds} rounds)")
            results += measure(shape_name, shape, dtype_name, providers, rounds, args.retries)
    overheads = call_overheads(results, shapes, args.overhead_rounds)
    if not (later_path and two_phase_path() == "python"):
        results += time_suite("two-phase", args)
    blocks = time_suite("block", args)
    streams = time_suite("stream", args)
    ops = time_ops(args, later_path)
    reads, models = ([], []) if later_path and kernel_path() == "python" else (time_reads(args), time_models(args))
    return (results + blocks + streams + ops + reads + models, overheads,
            block_rows(blocks, BLOCK_PROVIDERS) + block_rows(streams, STREAM_PROVIDERS))


def rounds_for(elements: int, args: argparse.Namespace) -> int:
    """--rounds, or 7 rounds where the snapshots hold 2^24 elements (T x N x H) or more and 101 for fewer."""
    return args.rounds or (7 if elements >= 1 << 24 else 101)


def time_suite(family: str, args: argparse.Namespace) -> list[Measurement]:
    """The two-phase ops', the blocks' or the stream's shapes of the run (float32 only), with the --providers of
    this family."""
    case_type, suite_providers = SUITES[family]
    providers = [name for name in args.providers if name in suite_providers]
    results = []
    for shape_name, shape in args.suite_shapes[family].items() if providers else ():
        case = case_type(shape)
        rounds = rounds_for(case.copy_elements(), args)
        print(f"{shape_name} float32 ({rounds} rounds)")
        results += measure_case(case, shape_name, "float32", providers, rounds, args.retries)
    return results


def time_ops(args: argparse.Namespace, later_path: bool = False) -> list[Measurement]:
    """The generic family: each chosen registry op at its shapes of the run and the --dtypes it takes."""
    providers = [name for name in args.providers if name in OP_PROVIDERS]
    generic = registry.generic_ops()
    results = []
    for name, named in args.op_shapes.items() if providers else ():
        op = generic[name]
        if later_path and op_path(op.kernel) == "python":
            continue
        dtypes = timed_dtypes(op, args.dtypes)
        if named and not dtypes:
            print(f"{name}: takes none of the dtypes {' '.join(args.dtypes)}; not timed")
        for shape_name, shape in named.items():
            for dtype_name in dtypes:
                case = OpCase(op, shape, DTYPES[dtype_name])
                rounds = rounds_for(case.copy_elements(), args)
                print(f"{shape_name} {dtype_name} ({rounds} rounds)")
                results += measure_case(case, shape_name, dtype_name, providers, rounds, args.retries)
    return results


def time_reads(args: argparse.Namespace) -> list[Measurement]:
    """The general read's shapes of the run, each --dtypes, with the --providers a shape times (timed_providers)."""
    results = []
    for shape_name, shape in args.read_shapes.items():
        providers = timed_providers(shape, args.providers)
        for dtype_name in args.dtypes if providers else ():
            case = ReadCase(shape, DTYPES[dtype_name])
            rounds = rounds_for(case.copy_elements(), args)
            print(f"{shape_name} {dtype_name} ({rounds} rounds)")
            results += measure_case(case, shape_name, dtype_name, providers, rounds, args.retries)
    return results


def time_models(args: argparse.Namespace) -> list[Measurement]:
    """The tiny Inkling2 model's shapes of the run (float32 only), stock against patched (cases/model.py)."""
    providers = [name for name in args.providers if name in MODEL_PROVIDERS]
    results = []
    for shape_name, shape in args.model_shapes.items() if providers else ():
        rounds = args.rounds or MODEL_ROUNDS
        print(f"{shape_name} float32 ({rounds} rounds)")
        results += measure_case(ModelCase(shape), shape_name, "float32", providers, rounds, args.retries)
    return results
