"""Bit matrices (lcmac.bits): the packed layout, the Four Russians products over GF(2) and the
Boolean semiring, the LCMA recursion over GF(2), and the refusals.  Every product is compared
exactly with numpy's integer product."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from lcmac.bits import PackedBits, boolean_matmul, gf2_matmul, pack, unpack
from lcmac.bits import lcma, products
from lcmac.bits.lcma import auto_levels, gf2_scheme, lcma_product
from lcmac.bits.products import KernelCount, four_russians, gf2_product
from lcmac.core.errors import AlgorithmError, CatalogueError, DTypeError, ShapeError
from lcmac.ir import get
from lcmac.ir.alternative_basis import from_standard
from lcmac.ir.gf2 import reduce_mod2

# (M, K, N): C is M×N, the inner dimension K
SHAPES = [(1000, 777, 1234), (63, 65, 127), (1, 1, 1), (64, 64, 64), (65, 1, 130)]
SMALL = [(63, 65, 127), (1, 1, 1), (64, 64, 64), (65, 1, 130), (130, 200, 257)]


@functools.lru_cache(maxsize=None)
def _case(M: int, K: int, N: int, seed: int = 0):
    """Random 0/1 operands and numpy's exact integer product."""
    rng = np.random.default_rng([M, K, N, seed])
    A = rng.integers(0, 2, (M, K), dtype=np.uint8)
    B = rng.integers(0, 2, (K, N), dtype=np.uint8)
    P = A.astype(np.int64) @ B
    return A, B, P


# ---- the packed layout -------------------------------------------------------------------

@pytest.mark.parametrize("ncols", [1, 7, 63, 64, 65, 127, 128, 129, 1000])
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int64])
def test_pack_unpack_round_trip(ncols, dtype):
    a = np.random.default_rng(ncols).integers(0, 2, (5, ncols)).astype(dtype)
    p = pack(a)
    assert p.data.dtype == np.uint64 and p.data.shape == (5, -(-ncols // 64))
    back = unpack(p)
    assert back.dtype == np.uint8 and np.array_equal(back, a.astype(np.uint8))
    assert np.array_equal(unpack(p.data, ncols), back)        # the raw words and a width


def test_layout_is_little_endian_words():
    a = np.zeros((2, 130), np.uint8)
    a[0, 0] = a[0, 63] = a[0, 64] = a[1, 129] = 1
    d = pack(a).data
    assert d[0, 0] == (1 | 1 << 63) and d[0, 1] == 1 and d[0, 2] == 0
    assert d[1, 2] == 2 and d[1, 0] == d[1, 1] == 0


def test_packed_bits_refuses_what_breaks_the_layout():
    good = pack(np.ones((3, 70), np.uint8)).data
    with pytest.raises(ShapeError, match="row 1 has nonzero padding bits beyond column 70"):
        bad = good.copy()
        bad[1, 1] |= np.uint64(1 << 10)
        PackedBits(bad, 3, 70)
    with pytest.raises(DTypeError, match="dtype uint64"):
        PackedBits(good.astype(np.int64), 3, 70)
    with pytest.raises(ShapeError, match=r"3 rows of 200 bits need 3×4 words"):
        PackedBits(good, 3, 200)
    with pytest.raises(ShapeError, match="C-contiguous"):
        PackedBits(np.asfortranarray(np.zeros((3, 2), np.uint64)), 3, 70)
    with pytest.raises(ShapeError, match="needs ncols"):
        unpack(good)


def test_pack_refuses_values_dtypes_and_shapes():
    with pytest.raises(ValueError, match=r"array\[1, 2\] = 2 is not 0 or 1"):
        pack(np.array([[0, 1, 0], [1, 0, 2]]))
    with pytest.raises(ValueError, match=r"\[0, 0\] = -1 is not 0 or 1"):
        pack(np.array([[-1]], np.int8))
    with pytest.raises(DTypeError, match="dtype float32"):
        pack(np.ones((2, 2), np.float32))
    with pytest.raises(ShapeError, match="must be 2-D"):
        pack(np.ones(4, np.uint8))
    with pytest.raises(DTypeError, match="got list"):
        pack([[0, 1]])


# ---- products against numpy ----------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gf2_and_boolean_products_equal_numpy(shape):
    A, B, P = _case(*shape)
    C = gf2_matmul(A, B)
    assert C.dtype == np.uint8 and C.shape == P.shape
    assert np.array_equal(C, P % 2)
    assert np.array_equal(gf2_matmul(A, B, algo="m4r"), P % 2)
    assert np.array_equal(boolean_matmul(A, B), (P > 0).astype(np.uint8))


def test_packed_operands_give_packed_results():
    A, B, P = _case(63, 65, 127)
    C = gf2_matmul(pack(A), pack(B))
    assert isinstance(C, PackedBits) and C == pack((P % 2).astype(np.uint8))
    D = boolean_matmul(pack(A), pack(B))
    assert isinstance(D, PackedBits) and np.array_equal(D.to_array(), P > 0)


@pytest.mark.parametrize("t", range(1, 9))
@pytest.mark.parametrize("semiring", ["gf2", "boolean"])
def test_every_table_size_gives_the_product(t, semiring):
    A, B, P = _case(63, 65, 127)
    C = four_russians(pack(A).data, pack(B).data, semiring=semiring, t=t)
    want = P % 2 if semiring == "gf2" else P > 0
    assert np.array_equal(PackedBits(C, 63, 127).to_array(), want)


def test_blocking_of_tables_rows_and_stacks(monkeypatch):
    """Chunks of groups, row blocks and sub-stacks cut at every size."""
    rng = np.random.default_rng(5)
    a = pack(rng.integers(0, 2, (3 * 40, 150), dtype=np.uint8)).data.reshape(3, 40, 3)
    b = pack(rng.integers(0, 2, (3 * 150, 100), dtype=np.uint8)).data.reshape(3, 150, 2)
    whole = four_russians(a, b)
    for nm in ("TABLE_BYTES", "ROW_BLOCK_BYTES", "STACK_BYTES"):
        monkeypatch.setattr(products, nm, 1)
    assert np.array_equal(four_russians(a, b), whole)
    for p in range(3):                         # a stack is its products, one by one
        assert np.array_equal(four_russians(a[p], b[p]), whole[p])
        A = unpack(a[p], 150).astype(np.int64)
        assert np.array_equal(unpack(whole[p], 100), (A @ unpack(b[p], 100)) % 2)


def test_empty_dimensions():
    for M, K, N in [(3, 0, 5), (0, 4, 4), (4, 4, 0)]:
        A, B = np.zeros((M, K), np.uint8), np.zeros((K, N), np.uint8)
        for algo in ("m4r", "auto", "winograd"):
            C = gf2_matmul(A, B, algo=algo)
            assert C.shape == (M, N) and not C.any()
        assert boolean_matmul(A, B).shape == (M, N)


def test_kernel_counts_its_word_operations():
    A, B, _ = _case(64, 64, 64)
    count = KernelCount()
    gf2_product(pack(A), pack(B), count=count)       # t = 6 for 64 rows: 11 groups, 1 word
    assert count.tables == 11 * 63 and count.accumulate == 10 * 64


# ---- the LCMA recursion over GF(2) ---------------------------------------------------------

@pytest.mark.parametrize("algo", ["strassen", "winograd", "winograd-ab", "strassen-ab",
                                  "laderman", "naive-2x3x4"])
@pytest.mark.parametrize("shape", SMALL, ids=lambda s: "x".join(map(str, s)))
def test_lcma_levels_equal_the_kernel(algo, shape):
    A, B, P = _case(*shape)
    want = gf2_matmul(A, B, algo="m4r")
    assert np.array_equal(want, P % 2)
    for levels in (1, 2):
        assert np.array_equal(gf2_matmul(A, B, algo=algo, levels=levels), want), levels


def test_three_levels_on_the_large_odd_shape():
    A, B, P = _case(1000, 777, 1234)
    for algo in ("winograd", "winograd-ab"):
        C, report = gf2_matmul(A, B, algo=algo, levels=3, return_report=True)
        assert np.array_equal(C, P % 2)
        # 13 and 20 words rounded up to multiples of 2^3 words; 1000 rows are one already
        assert report.padded_shape == (1000, 1024, 1536) and report.base_products == 343


def test_scheme_objects_are_accepted():
    A, B, P = _case(130, 200, 257)
    g = reduce_mod2(get("strassen"))
    pair = from_standard(get("winograd"), np.eye(4, dtype=int), [[1, 1, 0, 0], [0, 1, 0, 0],
                         [0, 0, 1, 0], [0, 0, 0, 1]], np.eye(4, dtype=int), ring="gf2")
    for algo in (get("winograd"), g, pair):
        assert np.array_equal(gf2_matmul(A, B, algo=algo, levels=2), P % 2)


def test_report_counts_the_block_xors():
    A, B, _ = _case(130, 200, 257)
    _, r = gf2_matmul(A, B, algo="winograd", levels=2, return_report=True)
    # Winograd over GF(2) after CSE: 4 + 4 + 7 XORs per node; 1 node, then 7
    assert r.block_xors == {"A": 4 * 8, "B": 4 * 8, "H": 7 * 8}
    # 257 bits are 5 words, rounded up to 8 (a multiple of 2^2)
    assert r.padded_shape == (132, 256, 512) and r.base_shape == (33, 64, 128)
    # words: per level, the XORs times one block of that level (every node at once)
    a1, b1, c1 = 66 * 2, 128 * 4, 66 * 4        # blocks after one level (rows × words)
    a2, b2, c2 = 33 * 1, 64 * 2, 33 * 2
    want = 4 * (a1 + 7 * a2) + 4 * (b1 + 7 * b2) + 7 * (c1 + 7 * c2)
    assert r.xor_words == want
    _, ab = gf2_matmul(A, B, algo="winograd-ab", levels=2, return_report=True)
    # the core: 3 + 3 + 6 per node; each basis change 1 XOR per group of 2×2 blocks, per level
    assert ab.block_xors == {"phi": 1 + 4, "psi": 1 + 4, "upsilon_inv": 1 + 4,
                             "A": 3 * 8, "B": 3 * 8, "H": 6 * 8}


def test_auto_levels_keep_the_base_case_large():
    s = gf2_scheme("winograd")
    assert auto_levels(s, (8191, 8192, 8192)) == 0
    assert auto_levels(s, (8192, 8192, 8192)) == 1
    assert auto_levels(s, (1 << 20, 1 << 20, 1 << 20)) == lcma.MAX_LEVELS
    assert auto_levels(s, (4096, 4096, 4096), base_bits=1024) == 2


def test_lcma_refusals():
    A, B, _ = _case(63, 65, 127)
    with pytest.raises(AlgorithmError, match="even denominator"):
        gf2_matmul(A, B, algo="dps-4x4x4-r48")
    with pytest.raises(CatalogueError, match="unknown algorithm"):
        gf2_matmul(A, B, algo="no-such-scheme")
    with pytest.raises(ValueError, match="levels must be a nonnegative integer"):
        gf2_matmul(A, B, algo="winograd", levels=-1)
    with pytest.raises(ValueError, match="algo='m4r' runs no recursion"):
        gf2_matmul(A, B, algo="m4r", levels=1)
    rational = from_standard(get("strassen"), *(np.eye(4, dtype=int),) * 3)
    with pytest.raises(AlgorithmError, match="over the rationals; bit matrices need one over GF"):
        lcma_product(pack(A), pack(B), rational, 1)


# ---- operands refused ----------------------------------------------------------------------

def test_bad_operands_are_refused_with_the_reason():
    A, B, _ = _case(63, 65, 127)
    with pytest.raises(ShapeError, match="inner dimensions differ: A is 63×65, B is 64×127"):
        gf2_matmul(A, B[:64])
    with pytest.raises(ShapeError, match="inner dimensions differ"):
        boolean_matmul(pack(A), pack(B[:64]))
    with pytest.raises(ValueError, match=r"B\[0, 0\] = 3 is not 0 or 1"):
        gf2_matmul(A, np.where(np.arange(B.size).reshape(B.shape) == 0, 3, B))
    with pytest.raises(DTypeError, match="A has dtype float64"):
        boolean_matmul(A.astype(np.float64), B)
    with pytest.raises(DTypeError, match="both as numpy arrays or both as PackedBits"):
        gf2_matmul(pack(A), B)
    with pytest.raises(ShapeError, match="A must be 2-D"):
        gf2_matmul(A[None], B)
