#!/usr/bin/env python3
"""The README's results table, made from bench/results.

Reads bench/results/index.json; every entry with ``table`` rows names a result file and, per
row, where the number is in it (``variant``, ``shape`` [M, N, K], ``metric``) and the ratio
written by hand (``ratio``).  Each ratio is checked against the file (to the third decimal),
then the rows are printed as a markdown table: device, date, case, lcmac / baseline, file.

    python3 scripts/results_table.py                  # print the table
    python3 scripts/results_table.py --check README.md   # exit 1 if README's table is stale
    python3 scripts/results_table.py --write README.md   # replace README's table

In README.md the table sits between the lines ``<!-- results-table -->`` and
``<!-- /results-table -->``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BEGIN, END = "<!-- results-table -->", "<!-- /results-table -->"
TOLERANCE = 0.0015          # a hand-written ratio is the file's, rounded to 3 decimals


class StaleError(Exception):
    pass


def _device(name: str) -> str:
    """A short device name for the table: the GPU, or the CPU's family and core count."""
    for short in ("H100", "H200", "A100"):
        if short in name:
            return short
    for cpu, short in (("EPYC", "AMD EPYC"), ("Sapphire Rapids", "Xeon"), ("Xeon", "Xeon")):
        if cpu in name:
            cores = re.search(r"(\d+)-core", name)
            return f"{short} VM" + (f", {cores.group(1)} cores" if cores else "")
    return name


def lookup(doc: dict, row: dict) -> float:
    """The value ``row`` names in a bench_cuda.py or bench_cpu.py result document."""
    shape = [int(x) for x in row["shape"]]
    for r in doc.get("results", []):
        if "variants" in r:                                   # bench_cpu.py
            if [r.get("M"), r.get("N"), r.get("K")] == shape and row["variant"] in r["variants"]:
                return float(r["variants"][row["variant"]][row["metric"]])
        elif r.get("variant") == row["variant"] and list(r.get("shape", [])) == shape:
            return float(r[row["metric"]])                    # bench_cuda.py
    raise StaleError(f"no {row['variant']} at {'x'.join(map(str, shape))}")


def rows(results: Path = RESULTS) -> list[dict]:
    """The table's rows, each checked against its file (StaleError names the first mismatch)."""
    index = json.loads((results / "index.json").read_text())
    out = []
    for e in index["entries"]:
        if not e.get("table"):
            continue
        doc = json.loads((results / e["file"]).read_text())
        for row in e["table"]:
            try:
                value = lookup(doc, row)
            except (KeyError, TypeError, ValueError) as err:
                raise StaleError(f"{e['file']}: {row['case']}: {err!r}") from None
            except StaleError as err:
                raise StaleError(f"{e['file']}: {row['case']}: {err}") from None
            if abs(value - float(row["ratio"])) > TOLERANCE:
                raise StaleError(f"{e['file']}: {row['case']}: index says {row['ratio']}, "
                                 f"the file has {value:.4f} ({row['metric']})")
            out.append({"device": _device(e["device"]), "date": e["date"], "case": row["case"],
                        "ratio": float(row["ratio"]), "file": e["file"]})
    return out


def table(results: Path = RESULTS) -> str:
    lines = ["| device | date | case | lcmac / baseline | file |", "|---|---|---|---|---|"]
    for r in rows(results):
        lines.append(f"| {r['device']} | {r['date']} | {r['case']} | {r['ratio']:.3f}× | "
                     f"[{r['file']}](bench/results/{r['file']}) |")
    return "\n".join(lines)


def block(text: str) -> tuple[int, int]:
    """Line span (start, end) of the text between the markers; ValueError if absent."""
    lines = text.split("\n")
    try:
        b = lines.index(BEGIN)
        e = lines.index(END, b + 1)
    except ValueError:
        raise ValueError(f"no {BEGIN} ... {END} block") from None
    return b + 1, e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--check", metavar="FILE", help="exit 1 if FILE's table differs from this one")
    g.add_argument("--write", metavar="FILE", help="replace FILE's table with this one")
    args = ap.parse_args(argv)
    try:
        t = table()
    except StaleError as err:
        print(f"results_table: {err}", file=sys.stderr)
        return 1
    if not (args.check or args.write):
        print(t)
        return 0
    path = Path(args.check or args.write)
    text = path.read_text()
    try:
        b, e = block(text)
    except ValueError as err:
        print(f"results_table: {path}: {err}", file=sys.stderr)
        return 1
    lines = text.split("\n")
    current = "\n".join(lines[b:e]).strip("\n")
    if args.check:
        if current != t:
            print(f"results_table: the table in {path} is stale; run "
                  f"python3 scripts/results_table.py --write {path}", file=sys.stderr)
            return 1
        return 0
    path.write_text("\n".join(lines[:b] + t.split("\n") + lines[e:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
