"""Fingerprint the code the test suite generates, to show a refactoring left it byte-identical.

Run the tests with a kept base directory, then hash every generated source under it:

    python -m pytest -q --basetemp /tmp/lcmac-fp tests
    python scripts/codegen_fingerprint.py /tmp/lcmac-fp > after.json
    python scripts/codegen_fingerprint.py --compare before.json after.json

Generated sources are the ``<artifact>.src`` (CUDA bundle), ``*.cu`` (CUDA kernels the worker
writes when asked) and ``<artifact>.tir.py`` (TensorIR)
files that ``lcmac build`` keeps beside each library.  Keys are the paths below the base
directory with pytest's numbered suffix dropped from the test's folder (it depends on which
tests ran), values the sorted sha256 digests of the sources found under that key.
``--subset`` compares only the keys the second run has (a run of a few test files).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

SOURCE_SUFFIXES = (".src", ".tir.py", ".cu")


def fingerprint(root: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name.endswith(SOURCE_SUFFIXES):
            test_dir, *rest = p.relative_to(root).parts
            key = "/".join([re.sub(r"\d+$", "", test_dir), *rest])
            out.setdefault(key, []).append(hashlib.sha256(p.read_bytes()).hexdigest())
    return {k: sorted(v) for k, v in out.items()}


def compare(before: dict, after: dict, subset: bool = False) -> int:
    if subset:
        before = {k: v for k, v in before.items() if k in after}
    common = sorted(set(before) & set(after))
    differ = [k for k in common if before[k] != after[k]]
    only_b, only_a = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    print(f"{len(common)} sources in both runs: {len(common) - len(differ)} identical, {len(differ)} differ")
    for k in differ:
        print(f"  differs: {k}")
    for k in only_b:
        print(f"  only before: {k}")
    for k in only_a:
        print(f"  only after: {k}")
    return 1 if differ or only_b or only_a else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="a pytest --basetemp directory, or (with --compare) two JSON files")
    ap.add_argument("--compare", action="store_true", help="compare two fingerprint files; exit 1 on any difference")
    ap.add_argument("--subset", action="store_true", help="with --compare: only the keys the second file has")
    a = ap.parse_args(argv)
    if a.compare:
        if len(a.paths) != 2:
            ap.error("--compare takes two fingerprint files")
        return compare(*(json.loads(Path(p).read_text()) for p in a.paths), subset=a.subset)
    json.dump(fingerprint(Path(a.paths[0])), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
