"""lcmac.ir.importers: format detection, the catalogues' index conventions, clear errors."""
import io
import os
import json
import pickle
import zipfile

import numpy as np
import pytest

from lcmac.core.errors import AlgorithmError, CatalogueError, LcmacError, VerificationError
from lcmac.ir import catalogue
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.importers import from_alphatensor, load_algorithm, load_file, parse_fmm_text, read_npz
from lcmac.ir.program import LinearProgram


# ---- writers for the foreign layouts (the inverse of the importers, written independently) --

def at_factors(alg, dtype=np.int64):
    """AlphaTensor's layout: u (mk×R) at i·k+l, v (kn×R) at l·n+j, w (nm×R) at j·m+i (Cᵀ)."""
    m, k, n, R = alg.m, alg.k, alg.n, alg.R
    u = np.zeros((m * k, R), dtype)
    v = np.zeros((k * n, R), dtype)
    w = np.zeros((n * m, R), dtype)
    for r in range(R):
        for i in range(m):
            for l in range(k):
                u[i * k + l, r] = alg.U[r, i, l]
        for l in range(k):
            for j in range(n):
                v[l * n + j, r] = alg.V[r, l, j]
        for i in range(m):
            for j in range(n):
                w[j * m + i, r] = alg.W[r, i, j]
    return u, v, w


def save_npz(path, entries: dict):
    """Like the published file: 3-D int arrays where the factors agree in shape, else objects."""
    arrays = {}
    for key, (u, v, w) in entries.items():
        if u.shape == v.shape == w.shape:
            arrays[key] = np.stack([u, v, w])
        else:
            obj = np.empty(3, dtype=object)
            obj[0], obj[1], obj[2] = u, v, w
            arrays[key] = obj
    np.savez(path, **arrays)


def fmm_scheme(alg):
    m, k, n, R = alg.m, alg.k, alg.n, alg.R
    u, v, w = at_factors(alg)
    return {"n": [m, k, n], "m": R, "z2": False, "u": u.T.tolist(), "v": v.T.tolist(),
            "w": w.T.tolist()}


def fmm_reduced(alg):
    """lcmac programs → FMM's reduced JSON (C outputs listed at j·m+i)."""
    m, n = alg.m, alg.n

    def terms(expr):
        return [{"index": s, "value": c} for c, s in expr]

    d = {"n": [alg.m, alg.k, alg.n], "m": alg.R, "z2": False,
         "complexity": {"naive": 0, "reduced": alg.programs["published_additions"]}}
    for stage, key in (("A", "u"), ("B", "v"), ("H", "w")):
        lp = LinearProgram.from_dict(alg.programs[stage])
        d[f"{key}_fresh"] = [terms(t) for t in lp.temps]
        outs = [terms(o) for o in lp.outputs]
        if stage == "H":
            outs = [outs[i * n + j] for j in range(n) for i in range(m)]
        d[key] = outs
    return d


def fmm_text(alg):
    def mat(a):
        return "{" + ", ".join("{" + ", ".join(str(x) for x in row) + "}" for row in a) + "}"
    rows = [f"  {{{mat(alg.U[r])}, {mat(alg.V[r])}, {mat(alg.W[r].T)}}}" for r in range(alg.R)]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def expect_error(path, exc=AlgorithmError, match=None, **kw):
    with pytest.raises(exc, match=match) as ei:
        load_file(path, **kw)
    assert isinstance(ei.value, LcmacError)
    assert str(path) in str(ei.value), str(ei.value)
    return str(ei.value)


# ---- AlphaTensor .npz --------------------------------------------------------------------

def test_alphatensor_npz_round_trip(tmp_path):
    names = ["at-2x2x2-r7", "at-2x3x4-r20", "fg-3x4x5-r47", "fg-4x4x5-r61"]
    algs = {n: catalogue.get(n) for n in names}
    p = tmp_path / "f.npz"
    save_npz(p, {f"{a.m},{a.k},{a.n}": at_factors(a) for a in algs.values()})
    got = load_file(p)
    assert len(got) == 4
    for a in got:
        ref = next(b for b in algs.values() if b.grid == a.grid)
        assert a == ref and a.name == f"at-{a.m}x{a.k}x{a.n}-r{a.R}"
    (one,) = load_file(p, key="3,4,5")
    assert one == algs["fg-3x4x5-r47"]
    assert load_algorithm(p, key="2, 3, 4") == algs["at-2x3x4-r20"]
    with pytest.raises(CatalogueError, match="holds 4 algorithms"):
        load_algorithm(p)
    expect_error(p, match="no key '9,9,9'", key="9,9,9")


def test_alphatensor_w_is_transposed(tmp_path):
    """Reading AlphaTensor's w as C (not Cᵀ) breaks even square grids; lcmac must transpose it."""
    for name in ("at-2x2x2-r7", "at-4x4x4-r49", "fg-3x3x3-r23"):
        alg = catalogue.get(name)
        u, v, w = at_factors(alg)
        assert from_alphatensor(u, v, w, alg.grid) == alg
        m, n, R = alg.m, alg.n, alg.R
        w_as_c = np.ascontiguousarray(alg.W.reshape(R, m * n).T).astype(np.int64)  # C, not Cᵀ
        assert not np.array_equal(w_as_c, w)
        p = tmp_path / f"{name}.npz"
        save_npz(p, {f"{m},{alg.k},{n}": (u, v, w_as_c)})
        msg = expect_error(p, VerificationError, match="Brent equation")
        assert "key" in msg


def test_alphatensor_real_file_if_present(tmp_path):
    import subprocess
    repo = os.environ.get("LCMAC_ALPHATENSOR_REPO")   # a checkout or bare mirror of google-deepmind/alphatensor
    if not repo:
        pytest.skip("set LCMAC_ALPHATENSOR_REPO to a checkout of google-deepmind/alphatensor")
    try:
        data = subprocess.run(["git", "-C", repo, "show", "HEAD:algorithms/factorizations_r.npz"],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no AlphaTensor repository at {repo}")
    p = tmp_path / "factorizations_r.npz"
    p.write_bytes(data)
    for key in ("2,3,4", "3,4,5", "4,5,5"):
        (a,) = load_file(p, key=key)   # object arrays, read without trusting pickle
        assert a.grid == tuple(int(x) for x in key.split(","))
    assert load_file(p, key="4,5,5")[0] == catalogue.get("at-4x5x5-r76")


def test_npz_wrong_shape(tmp_path):
    alg = catalogue.get("at-2x3x4-r20")
    u, v, w = at_factors(alg)
    p = tmp_path / "shape.npz"
    save_npz(p, {"2,3,4": (u, v, w[:-1])})
    expect_error(p, match=r"factor w has shape \(7, 20\), expected \(8, 20\)")
    save_npz(p, {"2,3,4": (u, v[:, :-1], w)})
    expect_error(p, match="factor v has shape")
    np.savez(p, **{"2,3,4": np.zeros((2, 6, 20), np.int64)})
    expect_error(p, match="expected 3 factors")
    np.savez(p, **{"2;3;4": np.stack(at_factors(catalogue.get("at-2x2x2-r7")))})
    expect_error(p, match="not of the form 'm,k,n'")


def test_npz_non_numbers_and_inexact(tmp_path):
    u, v, w = at_factors(catalogue.get("at-2x2x2-r7"), dtype=np.float64)
    p = tmp_path / "f.npz"
    bad = u.copy()
    bad[0, 0] = np.nan
    np.savez(p, **{"2,2,2": np.stack([bad, v, w])})
    expect_error(p, match="not finite")
    bad = u.copy()
    bad[0, 0] = np.pi
    np.savez(p, **{"2,2,2": np.stack([bad, v, w])})
    expect_error(p, match="not an exact small rational")
    bad[0, 0] = 0.1          # read exactly as 1/10, which is simply a wrong coefficient
    np.savez(p, **{"2,2,2": np.stack([bad, v, w])})
    expect_error(p, VerificationError, match="= 9/10, expected 1")
    # float64 factors holding exact integers are fine
    np.savez(p, **{"2,2,2": np.stack([u, v, w])})
    assert load_file(p)[0] == catalogue.get("at-2x2x2-r7")


def test_npz_tampered_coefficient(tmp_path):
    u, v, w = at_factors(catalogue.get("at-2x3x3-r15"))
    w[0, :] = 0                                  # c_11 loses every product
    p = tmp_path / "t.npz"
    save_npz(p, {"2,3,3": (u, v, w)})
    expect_error(p, VerificationError, match=r"in C\[0\]\[0\]")


def test_npz_garbage_and_truncated(tmp_path):
    p = tmp_path / "garbage.npz"
    p.write_bytes(b"\x00\x01 not a zip file at all" * 10)
    expect_error(p, match="not a readable .npz")
    good = tmp_path / "good.npz"
    save_npz(good, {"2,3,4": at_factors(catalogue.get("at-2x3x4-r20"))})
    raw = good.read_bytes()
    for cut in (len(raw) // 2, len(raw) - 30, 40):
        t = tmp_path / f"trunc{cut}.npz"
        t.write_bytes(raw[:cut])
        expect_error(t)
    empty = tmp_path / "empty.npz"
    np.savez(empty)
    expect_error(empty, match="holds no arrays")


def test_npz_pickle_is_not_trusted(tmp_path):
    """An object array whose pickle names anything but numpy's array machinery is refused."""
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": (3,)})
    assert f.getvalue().startswith(b"\x93NUMPY")
    buf = f.getvalue() + pickle.dumps(Evil(), protocol=3)
    p = tmp_path / "evil.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("2,2,2.npy", bytes(buf))
    msg = expect_error(p, match="refusing to load builtins.print")
    assert "2,2,2.npy" in msg
    with pytest.raises(AlgorithmError, match="refusing"):
        read_npz(p)


# ---- FastMatrixMultiplication JSON and .m ------------------------------------------------

def test_fmm_scheme_round_trip(tmp_path):
    for name in ("fg-3x4x5-r47", "at-2x3x4-r20", "laderman"):
        alg = catalogue.get(name)
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(fmm_scheme(alg)))
        (got,) = load_file(p)
        assert got == alg
        assert got.name == f"fg-{alg.m}x{alg.k}x{alg.n}-r{alg.R}"
        assert p.name in got.source


def test_fmm_scheme_errors(tmp_path):
    alg = catalogue.get("fg-2x4x4-r26")
    p = tmp_path / "s.json"
    d = fmm_scheme(alg)
    d["w"][3][5] = 1 - d["w"][3][5]
    p.write_text(json.dumps(d))
    expect_error(p, VerificationError, match="Brent equation")
    d = fmm_scheme(alg)
    d["u"] = d["u"][:-1]
    p.write_text(json.dumps(d))
    expect_error(p, match=r"u has shape \(25, 8\), expected \(26, 8\)")
    d = fmm_scheme(alg)
    d["v"][0][0] = "one"
    p.write_text(json.dumps(d))
    expect_error(p, match="'one' is not a number")
    d = fmm_scheme(alg)
    d["v"][0][0] = [1]
    p.write_text(json.dumps(d))
    expect_error(p, match="not a")
    d = fmm_scheme(alg)
    d["z2"] = True
    p.write_text(json.dumps(d))
    expect_error(p, match="modulo 2")
    d = fmm_scheme(alg)
    d["n"] = [2, 4]
    p.write_text(json.dumps(d))
    expect_error(p, match="'n' must be the grid")
    d = fmm_scheme(alg)
    del d["w"]
    p.write_text(json.dumps(d))
    expect_error(p, match="lacks the field 'w'")


def test_fmm_reduced_round_trip(tmp_path):
    for name in ("fgr-2x2x2-r7", "fgr-3x4x5-r47", "fgr-3x3x3-r23-d"):
        alg = catalogue.get(name)
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(fmm_reduced(alg)))
        (got,) = load_file(p)
        assert got == alg
        assert got.programs == alg.programs
        assert got.programs["published_additions"] == alg.programs["published_additions"]


def test_fmm_reduced_output_order_matters(tmp_path):
    """FMM lists C outputs in Cᵀ order; reading them in C order must fail verification."""
    alg = catalogue.get("fgr-3x4x5-r47")
    d = fmm_reduced(alg)
    lp = LinearProgram.from_dict(alg.programs["H"])
    d["w"] = [[{"index": s, "value": c} for c, s in o] for o in lp.outputs]  # C order
    p = tmp_path / "order.json"
    p.write_text(json.dumps(d))
    expect_error(p, VerificationError)


def test_fmm_reduced_errors(tmp_path):
    alg = catalogue.get("fgr-2x2x2-r7")
    p = tmp_path / "r.json"
    d = fmm_reduced(alg)
    d["u_fresh"][0][0]["index"] = 4        # a temp may not use itself (slot 4 is temp 0)
    p.write_text(json.dumps(d))
    expect_error(p, match=r"u_fresh\[0\]: index 4 is out of range 0..3")
    d = fmm_reduced(alg)
    d["w"][0].append({"index": 99, "value": 1})
    p.write_text(json.dumps(d))
    expect_error(p, match=r"w\[0\]: index 99 is out of range")
    d = fmm_reduced(alg)
    d["v"] = d["v"][:-1]
    p.write_text(json.dumps(d))
    expect_error(p, match="'v' must list 7 outputs, got 6")
    d = fmm_reduced(alg)
    d["w"][1][0] = {"idx": 0}
    p.write_text(json.dumps(d))
    expect_error(p, match="is not")
    d = fmm_reduced(alg)
    d["w"][1][0]["value"] = -d["w"][1][0]["value"]
    p.write_text(json.dumps(d))
    expect_error(p, VerificationError, match="Brent equation")


def test_fmm_text_form(tmp_path):
    alg = catalogue.get("laderman")
    p = tmp_path / "Laderman-333-23-98.m"
    p.write_text(fmm_text(alg))
    (got,) = load_file(p)
    assert got == alg
    assert parse_fmm_text(fmm_text(catalogue.get("fg-3x4x5-r47"))) == catalogue.get("fg-3x4x5-r47")
    p.write_text(fmm_text(alg)[:-40])
    expect_error(p, match="malformed .m scheme")


# ---- lcmac's own JSON --------------------------------------------------------------------

def test_lcmac_algorithm_and_catalogue_json(tmp_path):
    alg = catalogue.get("fgr-2x3x4-r20")
    p = tmp_path / "a.json"
    p.write_text(json.dumps(alg.to_dict()))
    got = load_algorithm(p)
    assert got == alg and got.name == alg.name and got.programs == alg.programs
    doc = {"format": "lcmac-catalogue/1", "source": "t", "license": "t",
           "algorithms": [catalogue.get(n).to_dict() for n in ("strassen", "laderman")]}
    p.write_text(json.dumps(doc))
    assert [a.name for a in load_file(p)] == ["strassen", "laderman"]
    assert load_algorithm(p, key="laderman") == catalogue.get("laderman")
    with pytest.raises(CatalogueError, match="no algorithm named 'winograd'"):
        load_file(p, key="winograd")


def test_lcmac_json_errors(tmp_path):
    p = tmp_path / "e.json"
    d = catalogue.get("strassen").to_dict()
    d["U"] = d["U"][:-1]
    d["rank"] = 7
    p.write_text(json.dumps(d))
    expect_error(p, match="V has shape")
    d = catalogue.get("strassen").to_dict()
    d["rank"] = 8
    p.write_text(json.dumps(d))
    expect_error(p, match="'rank' says 8")
    d = catalogue.get("strassen").to_dict()
    d["U"][0][0] = [1, [2, 3]]
    p.write_text(json.dumps(d))
    expect_error(p)
    d = catalogue.get("strassen").to_dict()
    d["W"][0][0][0] = None
    p.write_text(json.dumps(d))
    expect_error(p, match="not a number")
    d = catalogue.get("strassen").to_dict()
    d["format"] = "something-else/9"
    p.write_text(json.dumps(d))
    expect_error(p, match="unknown format 'something-else/9'")
    p.write_text(json.dumps({"format": "lcmac-catalogue/1"}))
    expect_error(p, CatalogueError, match="lacks its 'algorithms' list")
    p.write_text(json.dumps({"hello": 1}))
    expect_error(p, match="unrecognised JSON")
    p.write_text(json.dumps([1, 2, 3]))
    expect_error(p, match="top level is a list")
    d = catalogue.get("fgr-2x2x2-r7").to_dict()
    d["programs"]["C"] = d["programs"]["A"]
    p.write_text(json.dumps(d))
    expect_error(p, match="unknown program stage 'C'")
    d = catalogue.get("fgr-2x2x2-r7").to_dict()
    d["programs"]["A"] = {"n_inputs": 4}
    p.write_text(json.dumps(d))
    expect_error(p, match="program for stage A is malformed")


def test_garbage_and_truncated_json(tmp_path):
    good = json.dumps(catalogue.get("fg-3x3x3-r23").to_dict())
    p = tmp_path / "t.json"
    p.write_text(good[: len(good) // 2])
    expect_error(p, match="not valid JSON .*truncated")
    p.write_text("")
    expect_error(p)
    p.write_bytes(bytes(range(256)) * 4)
    expect_error(p, match="not a text file")
    p.write_text("hello world")
    expect_error(p, match="not valid JSON")
    p.write_text("[" * 100000)
    expect_error(p)
    expect_error(tmp_path / "missing.json", match="no such file")


def test_manual_algorithm_errors_are_algorithm_errors():
    with pytest.raises(AlgorithmError, match="factor u has shape"):
        from_alphatensor(np.zeros((3, 7)), np.zeros((4, 7)), np.zeros((4, 7)), (2, 2, 2))
    with pytest.raises(AlgorithmError, match="grid dimension"):
        from_alphatensor(np.zeros((4, 7)), np.zeros((4, 7)), np.zeros((4, 7)), (2, 0, 2))
    assert isinstance(Algorithm, type)
