"""``lcmac distribute``: how ``lcmac.distributed.matmul`` would spread one product over P
ranks, without running it: the plan's units per rank, what each is sent, the predicted times,
and the plain row split beside it (lcmac.costmodel.distributed; docs/distributed.md)."""
from __future__ import annotations

from lcmac.artifact.build import resolve_algorithm, resolve_target
from lcmac.costmodel.distributed import GLOO_BW, NVLINK_BW, plan_products
from lcmac.spec.profiles import get_profile
from lcmac.cli.exit_codes import UsageError
from lcmac.cli.output import dump_json, table
from lcmac.core.dtypes import normalize_dtype


def cmd_distribute(args) -> int:
    M, N, K = args.shape
    if args.ranks < 1:
        raise UsageError(f"--ranks must be at least 1, got {args.ranks}")
    for nm in ("src", "dst"):
        v = getattr(args, nm)
        if v is not None and not 0 <= v < args.ranks:
            raise UsageError(f"--{nm} must be a rank in 0..{args.ranks - 1}, got {v}")
    target = resolve_target(args.target)
    profile = get_profile(target.profile)
    dtype = normalize_dtype(args.dtype)
    link = args.link_gbs * 1e9 if args.link_gbs else (NVLINK_BW if target.family == "cuda" else GLOO_BW)
    kw = dict(link_bw=link, src=args.src, dst=args.dst)
    alg = resolve_algorithm(args.algo)[0]
    plan = plan_products(alg, M, N, K, args.ranks, dtype, profile, strategy=args.strategy, **kw)
    split = plan_products(resolve_algorithm("gemm")[0], M, N, K, args.ranks, dtype, profile, **kw)
    ranks = [{"rank": p, "units": len(us), "products": list(plan.products_of(p)),
              "predicted_s": plan.rank_s[p], "sent_combined": {"A": a, "B": b}}
             for p, (us, (a, b)) in enumerate(zip(plan.units, plan.send_combined))]
    if args.json:
        dump_json("distribute", {
            "shape": {"M": M, "N": N, "K": K}, "dtype": dtype, "target": target.name,
            "algorithm": args.algo, "ranks": args.ranks, "src": args.src, "dst": args.dst,
            "link_bytes_per_s": link, "strategy": plan.strategy, "slices": plan.slices,
            "predicted_s": plan.predicted_s, "row_split_predicted_s": split.predicted_s,
            "partial_sums_moved": plan.partial_pieces, "why": plan.why, "per_rank": ranks})
        return 0
    print(f"{M}x{N}x{K} {dtype} by {args.algo} on {args.ranks} ranks of {target.name} "
          f"(links {link / 1e9:g} GB/s; predicted by the model, not measured)\n")
    rows = [[r["rank"], r["units"], " ".join(map(str, r["products"])), f"{r['predicted_s'] * 1e3:.2f}",
             "" if args.src is None or r["rank"] == args.src else
             "/".join("combined" if r["sent_combined"][o] else "raw" for o in "AB")] for r in ranks]
    print(table(rows, ["rank", "units", "products", "ms", "sent A/B"]))
    print(f"\nplan: {plan.why}")
    print(f"row split (algo gemm): predicted {split.predicted_s * 1e3:.2f} ms; "
          f"this plan is {split.predicted_s / plan.predicted_s:.3f}x that")
    return 0


def add_distribute_parser(sub, shape_arg, shape_help: str, dtype_help: str) -> None:
    s = sub.add_parser("distribute", help="how lcmac.distributed would spread one product over P ranks",
                       description="The plan of lcmac.distributed.matmul for one product on P "
                                   "ranks, from the cost model, without running anything: units "
                                   "(product, row slice) per rank, what --src sends each rank, "
                                   "predicted times, and the plain row split beside it.")
    s.add_argument("--shape", required=True, type=shape_arg, metavar="MxNxK", help=shape_help)
    s.add_argument("--ranks", required=True, type=int, metavar="P", help="ranks in the group")
    s.add_argument("--algo", default="strassen", help="algorithm name or expression (default strassen)")
    s.add_argument("--target", default="cuda-sm90a",
                   help="each rank's target (default cuda-sm90a; a CPU target prices gloo links)")
    s.add_argument("--dtype", default="bfloat16", help=dtype_help)
    s.add_argument("--src", type=int, default=None, metavar="R", help="the rank holding A and B (default: all)")
    s.add_argument("--dst", type=int, default=None, metavar="R", help="the rank receiving C (default: all)")
    s.add_argument("--strategy", default="auto", choices=("auto", "slices", "products"))
    s.add_argument("--link-gbs", type=float, default=None, metavar="GB/S",
                   help="bandwidth per rank (default 300 for CUDA targets: NVLink; 2 for CPUs: gloo)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-distribute/1)")
    s.set_defaults(func=cmd_distribute)
