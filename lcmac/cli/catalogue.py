"""``lcmac list``, ``show`` and ``verify``: the algorithm catalogue, one algorithm in full, and
the exact check of a scheme against the Brent equations."""
from __future__ import annotations

import argparse
import os

from lcmac.core.errors import LcmacError
from lcmac.costmodel.accuracy import error_ratio
from lcmac.ir import catalogue
from lcmac.ir.basis_search import addition_report
from lcmac.ir.cse import optimized_programs
from lcmac.ir.gf2 import CHECK_RINGS, check_ring
from lcmac.ir.importers import load_file
from lcmac.ir.program import stage_names
from lcmac.ir.summary import summarize
from lcmac.cli.arguments import grid_arg
from lcmac.cli.exit_codes import FAILURE
from lcmac.cli.output import dump_json, table


def cmd_list(args) -> int:
    # GF(2)-only schemes are listed too (ring "gf2"); `catalogue.get` refuses them
    algs = catalogue.all_algorithms(include_naive=args.naive) + catalogue.gf2_algorithms()
    if args.grid:
        want = sorted(args.grid)
        algs = [a for a in algs if sorted(a.grid) == want]
    rows = [{**summarize(a), "ring": getattr(a, "ring", "rational")} for a in algs]
    ab = {}
    if args.alternative_basis:          # a quick search per scheme (heuristic beyond 4x4)
        for a, r in zip(algs, rows):
            try:
                ab[r["name"]] = addition_report(a, ring=args.alternative_basis, effort=0,
                                                polish=30, evaluations=5000)
            except LcmacError:          # e.g. a scheme with halves has no GF(2) image
                ab[r["name"]] = None
            r["alternative_basis"] = ab[r["name"]]
    if args.json:
        dump_json("list", {"algorithms": rows})
        return 0

    def ab_cols(name):
        rep = ab.get(name)
        return ["–", "–"] if rep is None else [rep["additions"]["core"], rep["additions"]["basis_changes"]]
    extra = ["AB core", "AB basis"] if args.alternative_basis else []
    print(table([[r["name"], "x".join(map(str, r["grid"])), r["rank"],
                   f"{100 * r['saving']:.1f}%",
                   f"{r['nnz']['U']}/{r['nnz']['V']}/{r['nnz']['W']}",
                   r["additions"]["naive"]["total"], r["additions"]["reduced"]["total"],
                   *(ab_cols(r["name"]) if args.alternative_basis else []),
                   r["source"][:48]] for r in rows],
                 ["name", "grid", "R", "saved", "nnz U/V/W", "adds", "adds(CSE)", *extra, "source"]))
    print(f"\n{len(rows)} algorithms; composed ones are written a*b, a^L, a@MxKxN (see `lcmac show`).")
    return 0


def cmd_show(args) -> int:
    alg = catalogue.get(args.name)
    s = summarize(alg)
    progs = optimized_programs(alg)
    names = stage_names(alg)
    # the error this scheme adds, by dtype (Algorithm 1's roundings; lcmac.costmodel.accuracy)
    native = {dt: round(error_ratio(alg, dt).ratio, 2) for dt in ("bfloat16", "float16", "tfloat32")}
    # the scaled operand modes, against the plain GEMM on the same operands (fp16x2's ratio
    # moves with K: shown at K = 8192)
    scaled = {"fp8": round(error_ratio(alg, "bfloat16", operands="fp8").ratio, 2),
              "fp16x2": round(error_ratio(alg, "float32", operands="fp16x2", K=8192).ratio, 2)}
    errors = {**native, **scaled}
    if args.json:
        dump_json("show", {"algorithm": {**s, **{k: v for k, v in alg.to_dict().items()
                                               if k in ("U", "V", "W")}},
                       "programs": {st: p.to_dict() for st, p in progs.items()},
                       "predicted_error_ratio": errors})
        return 0
    print(f"{alg.name}  <{alg.m},{alg.k},{alg.n};{alg.R}>  (naive {alg.naive_rank}, "
          f"{100 * alg.saving:.1f}% fewer block products)")
    print(f"source: {alg.source}\nhash:   {alg.hash}\nnnz:    U {s['nnz']['U']}, V {s['nnz']['V']}, W {s['nnz']['W']}")
    a = s["additions"]
    print(f"additions: naive {a['naive']['total']} (A {a['naive']['A']}, B {a['naive']['B']}, H {a['naive']['H']}), "
          f"after CSE {a['reduced']['total']} (A {a['reduced']['A']}, B {a['reduced']['B']}, H {a['reduced']['H']})")
    print("error:  " + ", ".join(f"{dt} {e:.2f}x" for dt, e in native.items())
          + " the plain GEMM's (predicted, Algorithm 1; TF32 = the CUDA float32)")
    print(f"        fp8 operands {scaled['fp8']:.2f}x, fp16x2 {scaled['fp16x2']:.2f}x (K = 8192) the "
          f"plain GEMM's on the same operands")
    if alg.R > args.max_rank and not args.full:
        print(f"\n(R = {alg.R}: combine programs omitted; pass --full to print them)")
        return 0
    for st, title in (("A", "Combine A"), ("B", "Combine B"), ("H", "Combine H")):
        print(f"\n# {title}: {progs[st].additions} additions")
        print(progs[st].pretty(*names[st]))
    return 0


def cmd_verify(args) -> int:
    if os.path.exists(args.target):
        algs = load_file(args.target, check=False)
        algs = algs if isinstance(algs, list) else [algs]
    elif args.target.split("@")[0] in catalogue.gf2_names():
        algs = [catalogue.get_gf2(args.target)]        # valid only mod 2: verified there
    else:
        algs = [catalogue.get(args.target)]
    results = []
    for a in algs:
        c = check_ring(a, args.field)
        results.append({"name": a.name, "grid": [a.m, a.k, a.n], "rank": a.R,
                        "exact": not c.failures, "ring": _VERIFY_RING[c.ring],
                        "failures": [str(f) for f in c.failures[:10]],
                        "n_failures": len(c.failures), "n_rational_failures": c.rational_failures})
    ok = all(r["exact"] for r in results)
    if args.json:
        dump_json("verify", {"ok": ok, "field": args.field, "results": results})
    else:
        for r in results:
            _print_verified(r, args.field)
    return 0 if ok else FAILURE


# lcmac-verify/1 names the rational ring "rationals"
_VERIFY_RING = {"rational": "rationals", "gf2": "gf2"}


def _print_verified(r: dict, field: str) -> None:
    g = "x".join(map(str, r["grid"]))
    mod2 = r["ring"] == "gf2"
    if not r["exact"]:
        print(f"FAIL  {r['name']} <{g};{r['rank']}>: {r['n_failures']} Brent equation(s) fail"
              + (" modulo 2" if mod2 else ""))
        for f in r["failures"][:3]:
            print(f"      {f}" + (" (mod 2)" if mod2 else ""))
        return
    if r["n_rational_failures"]:
        how = (f"modulo 2 only ({r['n_rational_failures']} fail over the rationals): a GF(2) "
               f"scheme, for bit matrices; --field rational requires the rationals")
    else:
        how = ("exactly" if not mod2 else "modulo 2" if field == "gf2" else
               "modulo 2 (a GF(2)-only scheme)")
    m, k, n = r["grid"]
    print(f"OK    {r['name']} <{g};{r['rank']}>: all {m * k}·{k * n}·{m * n} Brent equations "
          f"hold {how}")


def _add_list(sub) -> None:
    s = sub.add_parser("list", help="list the algorithm catalogue",
                       description="The catalogue: each algorithm's grid <m,k,n>, rank R, "
                                   "saving over the naive m·k·n products, nonzeros of U/V/W and "
                                   "additions before and after common-subexpression elimination.")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-list/1)")
    s.add_argument("--naive", action="store_true", help="include the naive <m,k,n;mkn> schemes")
    s.add_argument("--alternative-basis", nargs="?", const="rational", choices=["rational", "gf2"],
                   help="also search an alternative basis per scheme (Karstadt-Schwartz; over GF(2) "
                        "with 'gf2'): the core's additions and the basis changes' "
                        "(docs/alternative-basis.md; slow on the whole catalogue, use --grid)")
    s.add_argument("--grid", type=grid_arg, metavar="MxKxN",
                   help="only algorithms of this grid <m,k,n>, written MxKxN, in any order of "
                        "m, k, n (e.g. 2x2x3: a grid, not a shape)")
    s.set_defaults(func=cmd_list)


def _add_show(sub) -> None:
    s = sub.add_parser("show", help="one algorithm in full, with its combine programs",
                       description="One algorithm: its source, hash, nonzeros, additions, the "
                                   "error it is predicted to add per dtype, and the straight-line "
                                   "programs of Combine A, B and H.")
    s.add_argument("name", help="catalogue name or expression: strassen, strassen^2, a*b, a@MxKxN")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-show/1)")
    s.add_argument("--full", action="store_true", help="print combine programs even for large R")
    s.add_argument("--max-rank", type=int, default=64, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_show)


def _add_verify(sub) -> None:
    s = sub.add_parser("verify", help="check an algorithm exactly against the Brent equations",
                       description="Exact check of every Brent equation, over the rationals or "
                                   "modulo 2 (--field); exit status 1 when one fails.")
    s.add_argument("target", metavar="FILE_OR_NAME",
                   help="a catalogue name, or a file: AlphaTensor .npz, FastMatrixMultiplication "
                        "JSON, lcmac JSON")
    s.add_argument("--field", default="auto", choices=CHECK_RINGS,
                   help="where the equations must hold: rational (integer and rational schemes), "
                        "gf2 (modulo 2: AlphaTensor's factorizations_f2.npz, bit matrices), or "
                        "auto (default): over the rationals, and where that fails, modulo 2, "
                        "saying so")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-verify/1)")
    s.set_defaults(func=cmd_verify)


def add_catalogue_parsers(sub) -> None:
    """``list``, ``show`` and ``verify``, in that order."""
    for add in (_add_list, _add_show, _add_verify):
        add(sub)
