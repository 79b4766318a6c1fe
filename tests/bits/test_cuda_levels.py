"""The GPU recursion's level rule (lcmac.bits.cuda.auto_levels), on numbers alone: no levels
below MIN_BITS, base products of at least BASE_BITS, and no more levels than fit in memory."""
from lcmac.bits import cuda as bits_cuda
from lcmac.bits.lcma import gf2_scheme


def test_levels_follow_the_measured_thresholds():
    w = gf2_scheme("winograd")
    assert [bits_cuda.auto_levels(w, (n, n, n)) for n in (16384, 32768, 65536)] == [0, 2, 3]
    assert bits_cuda.auto_levels(w, (65536, 16384, 65536)) == 0    # one side below MIN_BITS


def test_levels_are_capped_by_free_memory():
    w = gf2_scheme("winograd")
    n = 131072
    assert bits_cuda.auto_levels(w, (n, n, n)) == 4                 # BASE_BITS alone
    assert bits_cuda.auto_levels(w, (n, n, n), free_bytes=79 * 2 ** 30) == 3
    assert bits_cuda.auto_levels(w, (n, n, n), free_bytes=2 ** 30) == 0
