"""The ranking's shortcuts change nothing: ``select`` with the cost model's memos (per-profile
GEMM-stage prices and tiles, wave analyses, operand terms), the closed-form split-group count
and the combines shared by both Combine-H variants gives exactly — every candidate, time,
stage and reason — what the plain computation gives, on CPU and CUDA targets, in every dtype,
operand mode and option the callers use, with the memos cold and warm."""
import pytest

from lcmac.costmodel import decision, stages, waves
from lcmac.costmodel.decision import select

CASES = [
    ("x86_64-avx512", "float32", (1000, 1024, 4096), {}),
    ("x86_64-avx512", "float64", (2048, 2048, 2048), {"levels": (1, 2, 3), "dedupe": False}),
    ("x86_64-avx512", "float32", (4096, 4096, 4096), {"max_error": 4.0, "group_parallel": False}),
    ("x86_64-avx512", "bfloat16", (333, 777, 2049), {"static_b": True}),
    ("aarch64-neon", "float32", (512, 4096, 4096), {}),
    ("cuda-sm90a", "bfloat16", (8192, 8192, 8192), {"max_error": 16.0}),
    ("cuda-sm90a", "bfloat16", (256, 4096, 4096), {"static_b": True, "levels": (1, 2, 3)}),
    ("cuda-sm90a", "float16", (32768, 4096, 14336), {}),
    ("cuda-sm90a", "tfloat32", (2048, 512, 8192), {}),
    ("cuda-sm90a", "bfloat16", (16384, 16384, 16384), {"operands": "fp8", "max_error": 4.0}),
    ("cuda-sm90a", "bfloat16", (12288, 8192, 8192), {"operands": "fp16"}),
    ("cuda-sm90a", "float32", (8192, 8192, 8192), {"operands": "fp16x2"}),
    ("cuda-sm90a", "bfloat16", (4096, 4096, 4096),
     {"measurements": {"gemm": 1e-3, "strassen": 9e-4}, "max_error": 16.0}),
    ("cuda-sm80", "bfloat16", (6144, 4096, 4096), {}),
]


def _split_groups_by_walking(tiles, R, units):
    """The split-group count by walking every chunk boundary (the definition)."""
    if units <= 1 or R <= 1:
        return 0
    q, r = divmod(tiles, units)
    cuts, pos = 0, 0
    for u in range(units - 1):
        pos += q + (1 if u < r else 0)
        if 0 < pos < tiles and pos % R:
            cuts += 1
    return cuts


def _variants_one_by_one(alg, M, N, K, d, p, *, variants, **kw):
    return tuple(stages.lcma_estimates(alg, M, N, K, d, p, variants=(f,), **kw)[0]
                 for f in variants)


def _rankings():
    return [[c.to_dict() for c in select(M, N, K, dt, tgt, **kw)]
            for tgt, dt, (M, N, K), kw in CASES]


def _clear_memos():
    stages._BY_PROFILE.clear()
    waves._wave_analysis.cache_clear()
    stages.operand_terms.cache_clear()


def test_the_memos_change_no_ranking(monkeypatch):
    _clear_memos()
    cold = _rankings()
    warm = _rankings()
    with monkeypatch.context() as m:
        m.setattr(stages, "_by_profile", lambda key, p, compute: compute())
        m.setattr(waves, "_wave_analysis", waves._wave_analysis.__wrapped__)
        m.setattr(waves, "_split_groups", _split_groups_by_walking)
        m.setattr(stages, "operand_terms", stages.operand_terms.__wrapped__)
        m.setattr(decision, "lcma_estimates", _variants_one_by_one)
        plain = _rankings()
    assert sum(map(len, plain)) > 2000
    for case, a, b, c in zip(CASES, plain, cold, warm):
        assert a == b == c, case


@pytest.mark.parametrize("units", [*range(1, 24), 64, 78, 108, 114, 132])
def test_the_split_group_count_is_the_walked_one(units):
    for R in range(1, 50):
        for tiles in range(0, 3 * units + 60):
            walked = _split_groups_by_walking(tiles, R, units)
            assert waves._split_groups(tiles, R, units) == walked, (tiles, R, units)


def test_memoised_details_are_the_callers_own():
    from lcmac.spec.profiles import get_profile
    p = get_profile("h100")
    _, det = stages._gemm_compute(p, "bfloat16", 1024, 1024, 1024, 7, 2, 2, "split-group")
    det["tile"].append(0)
    det["waves"] = -1
    _, again = stages._gemm_compute(p, "bfloat16", 1024, 1024, 1024, 7, 2, 2, "split-group")
    assert len(again["tile"]) == 2 and again["waves"] > 0
