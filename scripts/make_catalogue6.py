#!/usr/bin/env python3
"""Write lcmac/ir/data/catalogue6.json (best-known schemes, grids up to 6) and gf2.json
(schemes that hold only modulo 2) from bare mirrors of the public catalogues.

    python scripts/make_catalogue6.py --fmm DIR --alphatensor DIR --alphaevolve DIR --flips DIR

Each DIR is a git checkout or bare mirror; files are read with `git show HEAD:path`, parsed
with lcmac.ir.importers (or lcmac.ir.gf2.load_gf2), verified exactly and written with
scripts/make_catalogue.py's helpers.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import make_catalogue as mc  # noqa: E402
from lcmac.ir.gf2 import load_gf2  # noqa: E402
from lcmac.ir.importers import load_file  # noqa: E402
from lcmac.ir.transforms import compose  # noqa: E402
from lcmac.ir import builtin  # noqa: E402

FMM_ZT_REDUCED = ["2x2x6_m21_cr44_cn54", "2x3x6_m30_cr81_cn116", "2x4x6_m39_cr136_cn202",
                  "2x5x6_m47_cr181_fv63_cn332", "4x4x6_m73_cr280_cn540",
                  "4x5x6_m90_cr380_fv180_cn1023", "4x6x6_m105_cr430_fv243_cn894",
                  "5x5x6_m110_cr460_fv204_cn1215", "5x6x6_m130_cr562_fv250_cn1716",
                  "6x6x6_m153_cr655_fv329_cn2182"]
FMM_ZT = ["2x6x6_m56", "3x3x6_m42", "3x4x6_m54", "3x5x6_m68", "3x6x6_m83"]
SMIRNOV = ("A. V. Smirnov, The bilinear complexity and practical algorithms for matrix "
           "multiplication, Comput. Math. Math. Phys. 53 (2013) 1781-1795")


def load_blob(repo: Path, path: str, tmp: Path, **kw):
    f = tmp / Path(path).name
    f.write_bytes(mc.show(repo, path, binary=True))
    return f


def main() -> None:
    ap = argparse.ArgumentParser()
    for a in ("fmm", "alphatensor", "alphaevolve", "flips"):
        ap.add_argument(f"--{a}", type=Path, required=True)
    args = ap.parse_args()
    fmm, fmm_rev = args.fmm, mc.head(args.fmm)[:7]
    tmp = Path(tempfile.mkdtemp())
    algs = []

    # AlphaEvolve's <2,4,5;32> (coefficients 1/2): the best rank known for <2,4,5>
    ae_rev = mc.head(args.alphaevolve)[:7]
    nb = load_blob(args.alphaevolve, "mathematical_results.ipynb", tmp)
    (ae,) = [a for a in load_file(nb) if a.name == "ae-2x4x5-r32"]
    algs.append(mc.check(ae.renamed(ae.name, (
        "AlphaEvolve (A. Novikov et al., AlphaEvolve: a coding agent for scientific and "
        f"algorithmic discovery, 2025), google-deepmind/alphaevolve_results@{ae_rev} "
        "mathematical_results.ipynb decomposition_245, CC BY 4.0")), ternary=False))

    for stem in FMM_ZT_REDUCED:
        p = f"schemes/results/addition_reduced_ZT/{stem}_ZT_reduced.json"
        (a,) = load_file(load_blob(fmm, p, tmp))
        algs.append(mc.check(a.renamed(a.name, (
            "FastMatrixMultiplication addition-reduced ZT scheme (Perminov et al.), "
            f"dronperminov/FastMatrixMultiplication@{fmm_rev} {p}, MIT"))))
    for stem in FMM_ZT:
        p = f"schemes/results/ZT/{stem}_ZT.json"
        (a,) = load_file(load_blob(fmm, p, tmp))
        algs.append(mc.check(a.renamed(a.name, (
            "FastMatrixMultiplication ZT scheme (Perminov et al.), "
            f"dronperminov/FastMatrixMultiplication@{fmm_rev} {p}, MIT"))))

    # Smirnov's <3,3,6;40> (coefficients 1/8) and its use on both halves of <3,6,6>
    p336 = "schemes/known/tensor/3x3x6_tensor.mpl"
    (s336,) = load_file(load_blob(fmm, p336, tmp))
    s336 = s336.renamed("smirnov-3x3x6-r40", (
        f"{SMIRNOV}; coefficients from the Maple form of the fmm.univ-lille.fr catalogue in "
        f"dronperminov/FastMatrixMultiplication@{fmm_rev} {p336}, verified exactly by lcmac"))
    algs.append(mc.check(s336, ternary=False))
    p366 = "schemes/known/tensor/3x6x6_tensor.mpl"
    (s366,) = load_file(load_blob(fmm, p366, tmp))
    doubled = compose(s336, builtin.naive(1, 2, 1))
    terms = lambda a: sorted(map(str, zip(a.U.reshape(a.R, -1).tolist(),  # noqa: E731
                                          a.V.reshape(a.R, -1).tolist(),
                                          a.W.reshape(a.R, -1).tolist())))
    assert terms(s366) == terms(doubled), "3x6x6;80 is not Smirnov's 3x3x6;40 doubled"
    algs.append(mc.check(s366.renamed("smirnov-3x6x6-r80", (
        f"{SMIRNOV}: his <3,3,6;40> on each half of the inner dimension; coefficients from "
        f"the Maple form of the fmm.univ-lille.fr catalogue in "
        f"dronperminov/FastMatrixMultiplication@{fmm_rev} {p366}, verified exactly by lcmac")),
        ternary=False))

    algs.sort(key=lambda a: (sorted(a.grid), a.R, a.name))
    mc.write_catalogue(
        "catalogue6.json",
        "The best-known scheme for every grid with dimensions up to 6 that the 2..5 files "
        "lack (ranks as in dronperminov/FastMatrixMultiplication schemes/status.json): "
        f"dronperminov/FastMatrixMultiplication@{mc.head(fmm)} schemes/results "
        "(flip-graph ZT schemes, addition-reduced ones with their straight-line programs) and "
        "schemes/known/tensor (Smirnov's rational <3,3,6;40>, <3,6,6;80>); "
        f"google-deepmind/alphaevolve_results@{mc.head(args.alphaevolve)} (<2,4,5;32>); "
        "C-factor transposed back to lcmac's convention",
        "MIT (c) 2025 Andrew Perminov; CC BY 4.0 (c) Google LLC (AlphaEvolve); Smirnov's "
        "schemes are published mathematical results; see NOTICE",
        [mc.entry(a) for a in algs])

    # schemes that hold only modulo 2 and beat every rational scheme of their grid
    at_rev = mc.head(args.alphatensor)[:7]
    (at47,) = load_gf2(load_blob(args.alphatensor, "algorithms/factorizations_f2.npz", tmp),
                       key="4,4,4")
    fl_rev = mc.head(args.flips)[:7]
    (km60,) = load_gf2(load_blob(args.flips, "solutions/445-60-mod2.exp", tmp))
    gf2 = []
    for g, name, src in (
            (at47, "at-4x4x4-r47-gf2",
             "GF(2) only: AlphaTensor (Fawzi et al., Nature 610, 2022), google-deepmind/"
             f"alphatensor@{at_rev} algorithms/factorizations_f2.npz key '4,4,4', CC BY 4.0"),
            (km60, "flips-4x4x5-r60-gf2",
             "GF(2) only: M. Kauers, J. Moosbauer, Flip graphs for matrix multiplication "
             f"(ISSAC 2023, arXiv:2212.01175), jakobmoosbauer/flips@{fl_rev} "
             "solutions/445-60-mod2.exp (a published result; no code taken)")):
        d = g.integer_image().to_dict()
        del d["format"]
        gf2.append({"name": name, "ring": "gf2", "source": src,
                    **{k: v for k, v in d.items() if k not in ("name", "source")}})
    mc.write_catalogue(
        "gf2.json",
        "Schemes valid only over GF(2) (coefficients 0/1, Brent equations modulo 2) whose rank "
        "beats every rational scheme of their grid: "
        f"google-deepmind/alphatensor@{mc.head(args.alphatensor)} "
        "algorithms/factorizations_f2.npz (<4,4,4;47>) and "
        f"jakobmoosbauer/flips@{mc.head(args.flips)} solutions/445-60-mod2.exp (<4,4,5;60>); "
        "C-factor transposed back to lcmac's convention",
        "CC BY 4.0 (c) DeepMind (AlphaTensor); Kauers-Moosbauer's scheme is a published "
        "mathematical result; see NOTICE",
        gf2, ring="gf2")


if __name__ == "__main__":
    main()
