"""Tuning the fp8 operand mode (``tune --operands fp8``) without a GPU: its space, the CLI's
plan, and the measuring process it uses (cuBLAS FP8 as the vendor: lcmac.tune.fp8_measure;
its GPU side in tests/test_fp8_cuda.py)."""
from __future__ import annotations

import json

from lcmac.artifact import tuning_log as tdb
from lcmac.tune import space, tuner

GPU = "cuda-sm90a"


def test_fp8_space_keeps_the_contracts_tiles():
    """operands="fp8": every planned point is unfused, in the fp8 mode, with the 128-wide K
    slab (one scale block) and tiles whose two fp32 fragments fit the registers, and fits
    sm_90a's shared memory with its staged output tile; the mode's default comes first."""
    from lcmac.spec.cuda.smem import SMEM_PER_CTA, stage_bytes
    for algo in ("gemm", "strassen"):
        pts = tuner.plan_points(algo, GPU, "bfloat16", (16384, 16384, 16384), budget=100,
                                operands="fp8", measure_default=True)
        assert len(pts) > 20
        assert pts[0].config.to_dict() == space.default_config(GPU, "bfloat16", operands="fp8").to_dict()
        out = 2 if algo == "gemm" else 4
        for pt in pts:
            c = pt.config
            assert (c.operands, c.fused, c.block_k) == ("fp8", False, 128)
            assert c.block_n in (64, 128, 160, 192) and c.block_m // (c.threads // 128) == 64
            smem = c.stages * stage_bytes(c, "bfloat16") + c.store_via_smem * c.block_m * c.block_n * out
            assert smem <= SMEM_PER_CTA["sm_90a"], c


def test_cli_plans_fp8_tuning(tmp_path, capsys):
    """`lcmac tune --operands fp8` runs (a dry run here: the model, no GPU) and logs fp8
    records only, the vendor's marked fp8 too (decisions among native kernels never read
    them)."""
    from lcmac import cli
    code = cli.main(["tune", "--algo", "gemm,strassen", "--target", GPU, "--dtype", "bf16",
                     "--shape", "16384x16384x16384", "--operands", "fp8", "--budget", "3",
                     "--dry-run", "--json", "--logs", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["ok"]
    assert doc["results"][0]["best"]["config"]["operands"] == "fp8"
    recs = list(tdb.TuningDB(tmp_path).records(GPU, "bfloat16"))
    assert {r["algorithm"] for r in recs} == {"gemm", "strassen", "vendor"}
    assert all(r["config"].get("operands") == "fp8" for r in recs)


def test_fp8_tuning_measures_in_the_fp8_worker(tmp_path):
    """The measuring process of an fp8 search is the fp8 one (cuBLAS FP8 vendor, B̃
    prepared, fp8 tolerance), even when the caller shares a native worker."""
    from lcmac.tune.fp8_measure import Fp8MeasureWorker
    from lcmac.tune.measure import MeasureWorker
    seen = []

    def fake(pt):
        seen.append(pt.algorithm)
        return 1e-3, 0.01
    for given in (None, MeasureWorker()):
        opts = tuner.TuneOptions.from_keywords(budget=1, operands="fp8", measure_fn=fake, worker=given,
                                               measure_default=False)
        plan = tuner.plan_search("gemm", GPU, "bfloat16", (4096, 4096, 4096), opts.search)
        run = tuner._TuningRun(GPU, "bfloat16", (4096, 4096, 4096), opts, plan, tdb.TuningDB(tmp_path))
        try:
            assert isinstance(run._measuring_process(), Fp8MeasureWorker)
        finally:
            run.close()
