"""The catalogue to 6x6x6 (lcmac/ir/data/catalogue6.json), the GF(2)-only schemes
(lcmac/ir/data/gf2.json) and the importers for the formats the public catalogues use:
expression files, Maple tensor files, FastMatrixMultiplication plain text, AlphaEvolve's
notebook, and GF(2) files read with lcmac.ir.gf2.load_gf2."""
import json
from fractions import Fraction
from math import lcm
from pathlib import Path

import numpy as np
import pytest

from lcmac.cli.main import main
from lcmac.core.errors import AlgorithmError, LcmacError, VerificationError
from lcmac.ir import catalogue
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.gf2 import GF2Algorithm, gf2_failures, load_gf2, require_rational
from lcmac.ir.importers import load_file
from lcmac.ir.verify import brent_failures

DATA = Path(catalogue.__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]

# the best rank known for every grid m <= k <= n <= 6 (any coefficients in Q), each verified
# from the data below; matches dronperminov/FastMatrixMultiplication schemes/status.json
BEST = {
    (2, 2, 2): 7, (2, 2, 3): 11, (2, 2, 4): 14, (2, 2, 5): 18, (2, 2, 6): 21,
    (2, 3, 3): 15, (2, 3, 4): 20, (2, 3, 5): 25, (2, 3, 6): 30, (2, 4, 4): 26,
    (2, 4, 5): 32, (2, 4, 6): 39, (2, 5, 5): 40, (2, 5, 6): 47, (2, 6, 6): 56,
    (3, 3, 3): 23, (3, 3, 4): 29, (3, 3, 5): 36, (3, 3, 6): 40, (3, 4, 4): 38,
    (3, 4, 5): 47, (3, 4, 6): 54, (3, 5, 5): 58, (3, 5, 6): 68, (3, 6, 6): 80,
    (4, 4, 4): 48, (4, 4, 5): 61, (4, 4, 6): 73, (4, 5, 5): 76, (4, 5, 6): 90,
    (4, 6, 6): 105, (5, 5, 5): 93, (5, 5, 6): 110, (5, 6, 6): 130, (6, 6, 6): 153}
NEW = ["fgr-2x2x6-r21", "fgr-2x3x6-r30", "ae-2x4x5-r32", "fgr-2x4x6-r39", "fgr-2x5x6-r47",
       "fg-2x6x6-r56", "smirnov-3x3x6-r40", "fg-3x3x6-r42", "fg-3x4x6-r54", "fg-3x5x6-r68",
       "smirnov-3x6x6-r80", "fg-3x6x6-r83", "fgr-4x4x6-r73", "fgr-4x5x6-r90", "fgr-4x6x6-r105",
       "fgr-5x5x6-r110", "fgr-5x6x6-r130", "fgr-6x6x6-r153"]
GF2 = {"at-4x4x4-r47-gf2": ((4, 4, 4), 47), "flips-4x4x5-r60-gf2": ((4, 4, 5), 60)}


def _doc(fname):
    return json.loads((DATA / fname).read_text())


def matmul_residual(alg) -> np.ndarray:
    """Σ_r U⊗V⊗W minus the matrix-product tensor, scaled to integers by the common
    denominator: a second, independent exact check (numpy int64 einsum)."""
    tabs = [np.asarray(t, dtype=object).reshape(alg.R, -1) for t in (alg.U, alg.V, alg.W)]
    dens = [lcm(*(Fraction(x).denominator for x in t.flat)) for t in tabs]
    ints = [np.array([[int(Fraction(x) * d) for x in row] for row in t], dtype=np.int64)
            for t, d in zip(tabs, dens)]
    T = np.einsum("ra,rb,rc->abc", *ints).reshape(alg.m, alg.k, alg.k, alg.n, alg.m, alg.n)
    for i in range(alg.m):
        for l in range(alg.k):
            for j in range(alg.n):
                T[i, l, l, j, i, j] -= dens[0] * dens[1] * dens[2]
    return T


# ---- the data: every new scheme exactly, every grid at its best rank -----------------------

def test_files_list_the_new_schemes_with_provenance():
    doc = _doc("catalogue6.json")
    assert doc["format"] == "lcmac-catalogue/1" and doc["source"] and doc["license"]
    assert [d["name"] for d in doc["algorithms"]] == NEW
    assert all(d["source"] for d in doc["algorithms"])
    gf2 = _doc("gf2.json")
    assert [d["name"] for d in gf2["algorithms"]] == list(GF2)
    assert all(d["ring"] == "gf2" and d["source"].startswith("GF(2) only:")
               for d in gf2["algorithms"])
    assert sum(f.stat().st_size for f in DATA.glob("*.json")) < 3 * 2 ** 20
    notice = (ROOT / "NOTICE").read_text()
    for word in ("catalogue6.json", "gf2.json", "AlphaEvolve", "Smirnov", "factorizations_f2.npz",
                 "jakobmoosbauer/flips"):
        assert word in notice


@pytest.mark.parametrize("name", NEW)
def test_new_scheme_verifies_exactly(name):
    alg = catalogue.get(name)                     # verified by the catalogue on look-up
    body = name.split("-")
    assert body[-2] == "x".join(map(str, alg.grid)) and body[-1] == f"r{alg.R}"
    assert not matmul_residual(alg).any()
    assert alg.R < alg.naive_rank and alg.source
    if name.startswith("fg"):
        assert alg.is_ternary
    if name.startswith("fgr-"):
        assert alg.programs["published_additions"] > 0


def test_rational_and_integer_coefficients():
    assert not catalogue.get("smirnov-3x3x6-r40").is_integral          # ±1/8
    assert {x.denominator for x in catalogue.get("ae-2x4x5-r32").U.flat
            if isinstance(x, Fraction)} == {2}
    assert all(catalogue.get(n).is_ternary for n in NEW if n.startswith("fg"))


def test_every_grid_up_to_6_at_its_best_known_rank():
    best = {}
    for a in catalogue.all_algorithms():
        g = tuple(sorted(a.grid))
        best[g] = min(best.get(g, a.R), a.R)
    assert {g: r for g, r in best.items() if max(g) <= 6 and min(g) >= 2} == BEST
    # and every order of a grid is served, e.g. <6,2,5> from <2,5,6>
    img = catalogue.for_shape_grid((6, 2, 5))
    assert min(a.R for a in img) == 47 and all(a.grid == (6, 2, 5) for a in img)


def test_smirnov_3x6x6_is_his_3x3x6_on_both_halves():
    doubled = catalogue.get("smirnov-3x3x6-r40*naive-1x2x1")
    assert doubled.grid == (3, 6, 6) and doubled.R == 80
    terms = lambda a: sorted(map(str, zip(a.U.reshape(a.R, -1).tolist(),  # noqa: E731
                                          a.V.reshape(a.R, -1).tolist(),
                                          a.W.reshape(a.R, -1).tolist())))
    assert terms(doubled) == terms(catalogue.get("smirnov-3x6x6-r80"))


def test_catalogue6_loads_through_the_importer():
    algs = load_file(DATA / "catalogue6.json")
    assert [a.name for a in algs] == NEW
    assert all(a == catalogue.get(a.name) for a in algs)


# ---- GF(2)-only schemes ----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(GF2))
def test_gf2_scheme_verifies_over_gf2_and_not_over_the_integers(name):
    g = catalogue.get_gf2(name)
    assert isinstance(g, GF2Algorithm) and (g.grid, g.R) == GF2[name]
    assert gf2_failures(g) == []
    assert brent_failures(g.integer_image(), limit=1)          # wrong over the integers
    assert g.R < BEST[tuple(sorted(g.grid))]                     # beats every rational scheme
    assert name in catalogue.gf2_names() and name not in catalogue.base_names()


def test_gf2_scheme_is_refused_over_the_integers():
    with pytest.raises(VerificationError, match=r"valid only over GF\(2\).*Brent equation.*get_gf2"):
        catalogue.get("at-4x4x4-r47-gf2")
    for expr in ("at-4x4x4-r47-gf2*strassen", "flips-4x4x5-r60-gf2@5x4x4", "at-4x4x4-r47-gf2^2"):
        with pytest.raises(VerificationError, match="valid only over GF"):
            catalogue.get(expr)
    g = catalogue.get_gf2("at-4x4x4-r47-gf2")
    with pytest.raises(VerificationError, match="valid only over GF"):
        require_rational(g)
    with pytest.raises(VerificationError, match="floating-point"):
        g.as_float()
    assert all(a.ring == "gf2" for a in catalogue.gf2_algorithms())
    assert all(getattr(a, "ring", "rational") != "gf2" for a in catalogue.all_algorithms())


def test_gf2_images_and_reductions():
    img = catalogue.get_gf2("flips-4x4x5-r60-gf2@5x4x4")
    assert img.grid == (5, 4, 4) and gf2_failures(img) == []
    red = catalogue.get_gf2("fgr-6x6x6-r153")                   # a ternary scheme modulo 2
    assert red.R == 153 and set(red.U.flat) <= {0, 1}
    with pytest.raises(AlgorithmError, match="even denominator"):
        catalogue.get_gf2("smirnov-3x3x6-r40")


def test_list_shows_the_new_schemes(capsys):
    assert main(["list", "--json", "--grid", "6x2x2"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["algorithms"]}
    assert rows["fgr-2x2x6-r21"]["rank"] == 21 and rows["fgr-2x2x6-r21"]["ring"] == "rational"
    assert main(["list", "--grid", "4x5x4"]) == 0
    out = capsys.readouterr().out
    assert "flips-4x4x5-r60-gf2" in out and "GF(2) only" in out and "fg-4x4x5-r61" in out


# ---- importers: writers for the foreign forms (written independently of the readers) --------

def _num(c) -> str:
    return str(Fraction(c))


def _form(coeffs, letter, transpose=False) -> str:
    out = ""
    for (i, j), c in np.ndenumerate(coeffs):
        if c:
            i, j = (j, i) if transpose else (i, j)
            s = "-" if c < 0 else "+"
            mag = abs(Fraction(c))
            out += f"{s}{'' if mag == 1 else _num(mag) + '*'}{letter}{i + 1}{j + 1}"
    return out.lstrip("+")


def exp_text(alg) -> str:
    """One product per line, (A)*(B)*(Cᵀ): cJI is C[I][J]."""
    return "\n".join(f"({_form(alg.U[r], 'a')})*({_form(alg.V[r], 'b')})"
                     f"*({_form(alg.W[r], 'c', transpose=True)})" for r in range(alg.R)) + "\n"


def statement_text(alg) -> str:
    lines = [f"m{r + 1} = ({_form(alg.U[r], 'a')}) * ({_form(alg.V[r], 'b')})"
             for r in range(alg.R)]
    for i in range(alg.m):
        for j in range(alg.n):
            terms = "".join(f"{'-' if alg.W[r, i, j] < 0 else '+'}"
                            f"{'' if abs(alg.W[r, i, j]) == 1 else _num(abs(alg.W[r, i, j])) + '*'}"
                            f"m{r + 1}" for r in range(alg.R) if alg.W[r, i, j])
            lines.append(f"c{i + 1}{j + 1} = {terms.lstrip('+')}")
    return "\n".join(lines) + "\n"


def mpl_text(alg) -> str:
    def mat(a):
        return f"Matrix({a.shape[0]}, {a.shape[1]}, [" + ",".join(
            "[" + ",".join(_num(x) for x in row) + "]" for row in a) + "])"
    triads = [f"Triad([{mat(alg.U[r])}, {mat(alg.V[r])}, {mat(alg.W[r].T)}])"
              for r in range(alg.R)]
    return "A:=Matrix(1, 1, [[A_1_1]]):\nTensor:=TriadSet([" + ", ".join(triads) + "]):\n"


def fmm_txt(alg) -> str:
    w = [alg.W[r].T.ravel() for r in range(alg.R)]             # c_ij at j·m+i
    rows = [" ".join(_num(x) for x in np.concatenate([t.ravel() for t in ts]))
            for ts in ([alg.U[r] for r in range(alg.R)], [alg.V[r] for r in range(alg.R)], w)]
    return f"{alg.m} {alg.k} {alg.n} {alg.R}\n" + "\n".join(rows) + "\n"


def notebook(alg, complex_too=False) -> dict:
    """AlphaEvolve's layout: u (mk×R), v (kn×R), w (nm×R, Cᵀ), as float literals."""
    u = np.array([alg.U[r].ravel() for r in range(alg.R)], dtype=float).T
    v = np.array([alg.V[r].ravel() for r in range(alg.R)], dtype=float).T
    w = np.array([alg.W[r].T.ravel() for r in range(alg.R)], dtype=float).T
    lit = lambda a: f"np.array({a.tolist()!r}, dtype=np.float32)"  # noqa: E731
    cells = [{"cell_type": "markdown", "source": ["# decompositions"]},
             {"cell_type": "code", "source": [f"#@title Data\ndecomposition_x = ({lit(u)}, "
                                              f"{lit(v)},\n {lit(w)})\n"]}]
    if complex_too:
        cells.append({"cell_type": "code", "source": "decomposition_c = (np.array([[1j]]), "
                                                     "np.array([[1]]), np.array([[1]]))"})
    return {"nbformat": 4, "nbformat_minor": 0, "metadata": {}, "cells": cells}


def expect_error(path, exc=AlgorithmError, match=None):
    with pytest.raises(exc, match=match) as ei:
        load_file(path)
    assert isinstance(ei.value, LcmacError) and str(path) in str(ei.value)


ROUND_TRIP = ["smirnov-3x3x6-r40", "fgr-2x3x6-r30", "ae-2x4x5-r32"]


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_text_formats_round_trip(name, tmp_path):
    alg = catalogue.get(name)
    for fname, text in (("s.exp", exp_text(alg)), ("s.txt", exp_text(alg)),
                        ("statements.exp", statement_text(alg)), ("s.tensor.mpl", mpl_text(alg)),
                        ("fmm.txt", fmm_txt(alg))):
        p = tmp_path / fname
        p.write_text(text)
        (got,) = load_file(p)
        assert got == alg, fname
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(notebook(alg, complex_too=True)))
    (got,) = load_file(p)
    assert got == alg and got.name == f"ae-{alg.m}x{alg.k}x{alg.n}-r{alg.R}"


def test_expression_forms_of_the_flip_graph_files(tmp_path):
    """Factors side by side, a bare variable next to a bracket, a negated product, fractions."""
    strassen = catalogue.get("strassen")
    lines = exp_text(strassen).splitlines()
    p = tmp_path / "side.exp"
    p.write_text("\n".join(ln.replace(")*(", ")(") for ln in lines))
    assert load_file(p)[0] == strassen
    p.write_text("\n".join(f"-((-1)*{ln})" for ln in lines))
    assert load_file(p)[0] == strassen
    one = Algorithm(1, 1, 1, [[[1]]], [[[1]]], [[[1]]])
    for text in ("a11*b11*c11", "-(a11(b11)c11)*-1", "2*(1/2*a11)b11(c11)", "a11/2*b11*2*c11",
                 "(a_1_1) * (b_1_1) * (c_1_1);"):
        p.write_text(text)
        assert load_file(p)[0] == one, text


@pytest.mark.parametrize("text, match", [
    ("(a11+a22)*(b11+b22)", r"expected factors in a, b, c"),
    ("(a11+a22*(b11)*(c11)", r"unbalanced '\('"),
    ("(a1)*(b11)*(c11)", r"cannot read the variable 'a1'"),
    ("(a11)*(b11)*(a11)", r"must be a linear form in one of a, b, c"),
    ("(a11 b11)*(b11)*(c11)", r"cannot read"),
    ("m1 = (a11)*(b11)\nc11 = m2", r"uses a product that is not defined"),
    ("m2 = (a11)*(b11)\nc11 = m2", r"numbered m1..m1 without gaps"),
    ("m1 = (a11)*(b11)\nc11 = a11", r"must be a sum of products"),
    ("(a11)*(b11)*(c21)", r"C entry \(1,2\) is outside the 1x1 result"),
])
def test_expression_file_errors(text, match, tmp_path):
    p = tmp_path / "bad.exp"
    p.write_text(text)
    expect_error(p, match=match)


def test_other_format_errors(tmp_path):
    alg = catalogue.get("strassen")
    p = tmp_path / "bad.mpl"
    p.write_text(mpl_text(alg).replace("Triad([Matrix(2, 2", "Triad([Matrix(2, 3", 1))
    expect_error(p, match="shape")
    p.write_text(mpl_text(alg).replace("]), Triad([", "]), Triad([Matrix(1, 1, [[x]]), ", 1))
    expect_error(p, match="other than numbers")
    p.write_text("Tensor:=Matrix(1,1,[[1]])")
    expect_error(p, match="no 'TriadSet\\(' found")
    p = tmp_path / "bad.txt"
    text = fmm_txt(alg).splitlines()
    p.write_text("\n".join(text[:2] + [text[2] + " 0"] + text[3:]))
    expect_error(p, match=r"line v: 29 numbers, expected R·4 = 28")
    p.write_text("2 2 2\n" + "\n".join(text[1:]))
    expect_error(p, match="not a FastMatrixMultiplication text scheme")
    p = tmp_path / "bad.ipynb"
    p.write_text(json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source":
                 "decomposition_c = (np.array([[1j]]), np.array([[1]]), np.array([[1]]))"}]}))
    expect_error(p, match="complex coefficient 1j")
    p.write_text(json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source":
                 "decomposition_c = (np.array([[1, 0]]), np.array([[1]]), np.array([[1]]))"}]}))
    expect_error(p, match="fit no grid|shape")
    p.write_text(json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source":
                 "decomposition_c = (np.array(open('x')), np.array([[1]]), np.array([[1]]))"}]}))
    expect_error(p, match="not a literal table")
    p.write_text(json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source": "x = 1"}]}))
    expect_error(p, match="holds no 'decomposition_")
    p = tmp_path / "wrong.exp"
    p.write_text(exp_text(alg).replace("+b22", "-b22", 1))
    expect_error(p, VerificationError, match="Brent equation")


# ---- GF(2) files -------------------------------------------------------------------------------

def test_gf2_files_are_refused_as_rational_and_read_by_load_gf2(tmp_path):
    g = catalogue.get_gf2("flips-4x4x5-r60-gf2")
    t = g.integer_image()
    p = tmp_path / "445-60-mod2.exp"
    p.write_text(exp_text(t))
    expect_error(p, VerificationError, match=r"holds only modulo 2.*Brent equation.*load_gf2")
    (got,) = load_gf2(p)
    assert isinstance(got, GF2Algorithm) and got == g and got.name == "exp-4x4x5-r60-gf2"
    # AlphaTensor's factorizations_f2.npz layout: u (mk×R), v (kn×R), w (nm×R, Cᵀ)
    a = catalogue.get_gf2("at-4x4x4-r47-gf2").integer_image()
    u = np.array([a.U[r].ravel() for r in range(a.R)]).T
    v = np.array([a.V[r].ravel() for r in range(a.R)]).T
    w = np.array([a.W[r].T.ravel() for r in range(a.R)]).T
    p = tmp_path / "factorizations_f2.npz"
    np.savez(p, **{"4,4,4": np.stack([u, v, w])})
    expect_error(p, VerificationError, match="holds only modulo 2")
    (got,) = load_gf2(p)
    assert got == catalogue.get_gf2("at-4x4x4-r47-gf2") and got.name == "at-4x4x4-r47-gf2"
    (got,) = load_gf2(DATA / "gf2.json", key="flips-4x4x5-r60-gf2")
    assert got == g
    expect_error(DATA / "gf2.json", VerificationError, match="holds only modulo 2")
    bad = t.to_dict()
    bad["U"][0][0][0] ^= 1
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(VerificationError, match=r"not a correct matrix product over GF\(2\)"):
        load_gf2(p)
