#!/usr/bin/env python3
"""Regenerate lcmac's catalogue data files (lcmac/ir/data/*.json) from the public catalogues.

Inputs are read from git checkouts or bare mirrors (``git show <rev>:<path>``):

* google-deepmind/alphatensor      algorithms/factorizations_r.npz            (CC BY 4.0)
* dronperminov/FastMatrixMultiplication  schemes/...                          (MIT)
* with --dps48: the Dumas-Pernet-Sedoglavic rational <4,4,4;48> scheme (a published result;
  rational.json, outside the {-1, 0, 1} rule below, admitted by exact verification alone)

Only data is taken.  Every scheme is parsed with lcmac.ir.importers, verified exactly with the
Brent equations, and (for addition-reduced schemes) its straight-line programs are checked to
compute exactly the combine matrices of the algorithm.  Admission rule: grid dimensions in
2..5 and every coefficient in {-1, 0, 1}.

    python scripts/make_catalogue.py \
        --alphatensor PATH/TO/google-deepmind/alphatensor \
        --fmm PATH/TO/dronperminov/FastMatrixMultiplication
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lcmac.ir.algorithm import Algorithm  # noqa: E402
from lcmac.ir.importers import from_fmm_reduced, from_fmm_scheme, load_alphatensor, parse_fmm_text  # noqa: E402
from lcmac.ir.program import LinearProgram, combine_matrices  # noqa: E402
from lcmac.ir.verify import verify  # noqa: E402

DATA = ROOT / "lcmac" / "ir" / "data"
DIMS = range(2, 6)
CATALOGUE_FORMAT = "lcmac-catalogue/1"
EXPECTED_ADDITIONS = {(2, 2, 2): 15, (3, 3, 3): 58, (3, 4, 5): 161, (4, 4, 4): 159}


# ---- git access --------------------------------------------------------------------------

def git(repo: Path, *args: str, binary: bool = False):
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return out.stdout if binary else out.stdout.decode()


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def ls(repo: Path, prefix: str) -> list[str]:
    return git(repo, "ls-tree", "-r", "--name-only", "HEAD", prefix).split()


def show(repo: Path, path: str, binary: bool = False):
    return git(repo, "show", f"HEAD:{path}", binary=binary)


# ---- checks ------------------------------------------------------------------------------

def in_range(m: int, k: int, n: int) -> bool:
    return m in DIMS and k in DIMS and n in DIMS


def check(alg: Algorithm, ternary: bool = True) -> Algorithm:
    verify(alg)
    assert alg.is_ternary or not ternary, alg.name
    if alg.programs:
        want = combine_matrices(alg)
        for stage in "ABH":
            got = LinearProgram.from_dict(alg.programs[stage]).matrix()
            assert got.shape == want[stage].shape and (got == want[stage]).all(), (alg.name, stage)
    # the JSON form must round-trip
    back = Algorithm.from_dict(json.loads(json.dumps(alg.to_dict())))
    assert back == alg and back.programs == alg.programs, alg.name
    return alg


def entry(alg: Algorithm) -> dict:
    """The catalogue form: no "format" (implied by the file); a published addition count,
    which lcmac keeps beside the programs, is stored as "published_additions" at top level."""
    d = alg.to_dict()
    del d["format"]
    if d.get("programs"):
        progs = dict(d["programs"])
        pub = progs.pop("published_additions", None)
        d["programs"] = progs
        if pub is not None:
            d["published_additions"] = pub
    return d


def write_catalogue(fname: str, source: str, license_: str, algs: list[dict], **extra) -> Path:
    head_ = {"format": CATALOGUE_FORMAT, "source": source, "license": license_, **extra}
    lines = [json.dumps(head_, separators=(",", ":"))[:-1] + ',"algorithms":[']
    lines += [json.dumps(d, separators=(",", ":")) + ("," if i + 1 < len(algs) else "")
              for i, d in enumerate(algs)]
    lines.append("]}")
    path = DATA / fname
    path.write_text("\n".join(lines) + "\n")
    json.loads(path.read_text())  # sanity
    return path


def suffixed(base: str, i: int) -> str:
    return base if i == 0 else f"{base}-{chr(ord('a') + i)}"


# ---- AlphaTensor -------------------------------------------------------------------------

def make_alphatensor(repo: Path) -> dict:
    commit = head(repo)
    with tempfile.TemporaryDirectory() as td:
        npz = Path(td) / "factorizations_r.npz"
        npz.write_bytes(show(repo, "algorithms/factorizations_r.npz", binary=True))
        keys = list(np.load(npz, allow_pickle=False).files)
        out, skipped = [], []
        for key in keys:
            m, k, n = (int(x) for x in key.split(","))
            if not in_range(m, k, n):
                skipped.append({"key": key, "reason": "grid outside 2..5"})
                continue
            (alg,) = load_alphatensor(npz, key)  # verified, w transposed back
            if not alg.is_ternary:
                vals = sorted({int(x) if x == int(x) else float(x)
                               for t in (alg.U, alg.V, alg.W) for x in t.flat})
                skipped.append({"key": key, "reason": f"coefficients {vals} not all in {{-1,0,1}}"})
                continue
            src = (f"AlphaTensor (Fawzi et al., Nature 610, 2022), google-deepmind/alphatensor@"
                   f"{commit[:7]} algorithms/factorizations_r.npz key '{key}', CC BY 4.0")
            out.append(check(alg.renamed(f"at-{m}x{k}x{n}-r{alg.R}", src)))
    write_catalogue(
        "alphatensor.json",
        f"google-deepmind/alphatensor@{commit} algorithms/factorizations_r.npz "
        "(Fawzi et al., Discovering faster matrix multiplication algorithms with reinforcement "
        "learning, Nature 610, 47-53, 2022); factors converted to lcmac's convention (AlphaTensor's "
        "third factor describes C transposed)",
        "CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/), (c) DeepMind; see NOTICE",
        [entry(a) for a in out], skipped=skipped)
    return {"count": len(out), "names": [a.name for a in out], "skipped": skipped}


# ---- FastMatrixMultiplication ------------------------------------------------------------

_GRID = re.compile(r"^(\d+)x(\d+)x(\d+)_")
FMM_LICENSE = "MIT (c) 2025 Andrew Perminov; see NOTICE"


def _fmm_src(commit: str, path: str, what: str) -> str:
    return (f"FastMatrixMultiplication {what} (Perminov et al.), dronperminov/"
            f"FastMatrixMultiplication@{commit[:7]} {path}, MIT")


def make_flipgraph(repo: Path) -> dict:
    commit = head(repo)
    paths = [p for p in ls(repo, "schemes/results/ZT") if p.endswith("_ZT.json")]
    paths += [p for p in ls(repo, "schemes/results/naive_addition_reduced_ZT") if p.endswith("_ZT.json")]
    paths += [p for p in ls(repo, "schemes/known/a_60_addition") if p.endswith("_ZT.json")]
    groups: dict[tuple, list[tuple[Algorithm, str]]] = {}
    seen: set[str] = set()
    for p in paths:
        mt = _GRID.match(Path(p).name)
        if not mt or not in_range(*(int(x) for x in mt.groups())):
            continue
        d = json.loads(show(repo, p))
        alg = from_fmm_scheme(d)
        if not alg.is_ternary or alg.hash in seen:
            continue
        verify(alg)
        seen.add(alg.hash)
        groups.setdefault((alg.m, alg.k, alg.n, alg.R), []).append((alg, p))
    out = []
    for (m, k, n, R), lst in sorted(groups.items()):
        lst.sort(key=lambda ap: (ap[0].naive_additions()["total"], ap[1]))
        for i, (alg, p) in enumerate(lst):
            name = suffixed(f"fg-{m}x{k}x{n}-r{R}", i)
            out.append(check(alg.renamed(name, _fmm_src(commit, p, "ZT scheme"))))
    write_catalogue(
        "flipgraph.json",
        f"dronperminov/FastMatrixMultiplication@{commit} schemes/results/ZT, "
        "schemes/results/naive_addition_reduced_ZT, schemes/known/a_60_addition (flip-graph "
        "schemes with coefficients in {-1,0,1}); C-factor transposed back to lcmac's convention",
        FMM_LICENSE, [entry(a) for a in out])
    return {"count": len(out), "names": [a.name for a in out]}


def make_reduced(repo: Path) -> dict:
    commit = head(repo)
    groups: dict[tuple, list] = {}
    for p in ls(repo, "schemes/results/addition_reduced_ZT"):
        mt = _GRID.match(Path(p).name)
        if not p.endswith("_reduced.json") or not mt or not in_range(*(int(x) for x in mt.groups())):
            continue
        d = json.loads(show(repo, p))
        alg = from_fmm_reduced(d)
        cr = d["complexity"]["reduced"]
        assert alg.programs["published_additions"] == cr
        adds = sum(LinearProgram.from_dict(alg.programs[s]).additions for s in "ABH")
        if adds != cr:
            raise SystemExit(f"{p}: programs have {adds} additions, the file claims {cr}")
        if not alg.is_ternary:
            continue
        groups.setdefault((alg.m, alg.k, alg.n, alg.R), []).append((cr, d["complexity"].get("naive", 0), p, alg))
    out, claimed = [], {}
    for (m, k, n, R), lst in sorted(groups.items()):
        lst.sort(key=lambda t: (t[0], t[1], t[2]))
        for i, (cr, cn, p, alg) in enumerate(lst):
            name = suffixed(f"fgr-{m}x{k}x{n}-r{R}", i)
            a = check(alg.renamed(name, _fmm_src(commit, p, "addition-reduced ZT scheme")))
            out.append(entry(a))
            claimed[name] = cr
    for g, want in EXPECTED_ADDITIONS.items():
        name = f"fgr-{g[0]}x{g[1]}x{g[2]}-r" + str(next(R for (m, k, n, R) in groups if (m, k, n) == g))
        if claimed.get(name) != want:
            raise SystemExit(f"{name}: expected {want} published additions, got {claimed.get(name)}")
    write_catalogue(
        "flipgraph_reduced.json",
        f"dronperminov/FastMatrixMultiplication@{commit} schemes/results/addition_reduced_ZT "
        "(addition-reduced flip-graph schemes with their straight-line programs, converted to "
        "lcmac LinearProgram form: A inputs at i*k+l, B inputs at l*n+j, C outputs at i*n+j)",
        FMM_LICENSE, out)
    return {"count": len(out), "published_additions": claimed}


def make_classic(repo: Path) -> dict:
    commit = head(repo)
    p = "schemes/known/classic/Laderman-333-23-98.m"
    alg = parse_fmm_text(show(repo, p))
    src = ("J. D. Laderman, A noncommutative algorithm for multiplying 3x3 matrices using 23 "
           "multiplications, Bull. AMS 82 (1976) 126-128; coefficients from dronperminov/"
           f"FastMatrixMultiplication@{commit[:7]} {p}, MIT")
    alg = check(alg.renamed("laderman", src))
    write_catalogue(
        "classic.json",
        "Classical schemes: Laderman <3,3,3;23> (Bull. AMS 82, 1976), coefficients from "
        f"dronperminov/FastMatrixMultiplication@{commit} {p}",
        FMM_LICENSE, [entry(alg)])
    return {"count": 1, "names": [alg.name]}


DPS48_SOURCE = ("J.-G. Dumas, C. Pernet, A. Sedoglavic (2025): a <4,4,4;48> scheme over the "
                "rationals (the rank of AlphaEvolve's complex scheme, without complex numbers), "
                "listed at https://fmm.univ-lille.fr/4x4x4.html; coefficients transcribed from "
                "solven-eu/matmulcatalog@0a9f83a src/main/resources/schemes/known/section4/"
                "4x4x4-r48-dumas_pernet_sedoglavic_2025-929db4e.json (u, v, w in the "
                "FastMatrixMultiplication layout) and verified exactly by lcmac")


def make_rational(path: Path) -> dict:
    """Schemes whose coefficients are not all in {-1, 0, 1} (so outside the admission rule of
    the other files), admitted one by one: exact verification is the only test they need."""
    doc = json.loads(path.read_text())
    alg = check(from_fmm_scheme(doc, name="dps-4x4x4-r48", source=DPS48_SOURCE), ternary=False)
    write_catalogue("rational.json", "Schemes with rational (power-of-two) coefficients, one by "
                    "one from papers: " + DPS48_SOURCE,
                    "mathematical results published by their authors; see NOTICE", [entry(alg)])
    return {"count": 1, "names": [alg.name]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alphatensor", type=Path, required=True,
                    help="a git checkout or bare mirror of google-deepmind/alphatensor")
    ap.add_argument("--fmm", type=Path, required=True,
                    help="a git checkout or bare mirror of dronperminov/FastMatrixMultiplication")
    ap.add_argument("--dps48", type=Path, default=None,
                    help="the Dumas-Pernet-Sedoglavic <4,4,4;48> scheme as u/v/w JSON (the "
                         "FastMatrixMultiplication layout, coefficients as \"1/4\" strings); "
                         "without it lcmac/ir/data/rational.json is left as it is")
    args = ap.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    report = {"alphatensor": make_alphatensor(args.alphatensor),
              "flipgraph": make_flipgraph(args.fmm),
              "flipgraph_reduced": make_reduced(args.fmm),
              "classic": make_classic(args.fmm)}
    if args.dps48:
        report["rational"] = make_rational(args.dps48)
        print(f"rational.json: {', '.join(report['rational']['names'])}")
    at = report["alphatensor"]
    print(f"alphatensor.json: {at['count']} schemes: {', '.join(at['names'])}")
    for s in at["skipped"]:
        if s["reason"] != "grid outside 2..5":
            print(f"  skipped {s['key']}: {s['reason']}")
    print(f"  skipped {sum(s['reason'] == 'grid outside 2..5' for s in at['skipped'])} keys outside 2..5")
    print(f"flipgraph.json: {report['flipgraph']['count']} schemes: {', '.join(report['flipgraph']['names'])}")
    red = report["flipgraph_reduced"]
    print(f"flipgraph_reduced.json: {red['count']} schemes; published additions:")
    for nm, c in red["published_additions"].items():
        print(f"  {nm}: {c}")
    print(f"classic.json: {', '.join(report['classic']['names'])}")
    for f in sorted(DATA.glob("*.json")):
        print(f"  {f.name}: {f.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
