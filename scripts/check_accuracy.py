#!/usr/bin/env python
"""The accuracy model (lcmac.costmodel.accuracy) against measured errors.

Reads ``scripts/bench_cuda.py`` result files and prints, for every LCMA row the model
covers, the measured error ratio (÷ cuBLAS's; ÷ lcmac's own GEMM in the same operand mode
for TF32 and fp8) next to the
predicted one.  Exit status 1 when a prediction is further than ``--tolerance`` from its
measurement.

    python scripts/check_accuracy.py bench/results/h100-bfloat16-accuracy-a.json [...] \
        --out bench/results/accuracy-model-check.json
"""
import argparse, datetime, json, sys

from lcmac.costmodel.accuracy import compare_with_run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="bench_cuda.py JSON files")
    ap.add_argument("--tolerance", type=float, default=0.10, help="relative (default 0.10)")
    ap.add_argument("--out", default=None, help="write the comparison as JSON")
    args = ap.parse_args()
    rows, worst = [], 0.0
    print(f"{'file':34s} {'variant':24s} {'shape':>16s} {'model':>22s} {'measured':>9s} "
          f"{'predicted':>9s} {'dev':>7s}")
    for path in args.results:
        with open(path) as f:
            run = json.load(f)
        name = path.rsplit("/", 1)[-1]
        for c in compare_with_run(run["dtype"], run["results"]):
            c["file"] = name
            rows.append(c)
            worst = max(worst, abs(c["deviation"]))
            model = f"{c['model_dtype']} {c['model_variant']}" + \
                ("" if c["operands"] == "native" else f" {c['operands']}")
            print(f"{name:34s} {c['variant']:24s} {'x'.join(map(str, c['shape'])):>16s} "
                  f"{model:>22s} {c['measured']:9.2f} {c['predicted']:9.2f} {c['deviation']:+7.1%}")
    print(f"\n{len(rows)} rows; largest deviation {worst:.1%} (tolerance {args.tolerance:.0%})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(),
                       "command": "python " + " ".join(sys.argv), "tolerance": args.tolerance,
                       "largest_deviation": worst, "rows": rows}, f, indent=1)
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
