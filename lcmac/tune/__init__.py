"""The autotuner and its tuning-log database (``tuning_logs/<target>-<dtype>.jsonl``).

- ``space``: enumerate a template's configs, prune those that cannot fit on chip, rank the
  rest with an analytic per-config estimate.
- ``db``: the JSON Lines log; ``best_config(target, dtype, algo_hash, shape)``.
- ``measure``: timing an artifact in an isolated process (median of repeats, warm-up), and
  the vendor GEMM (cuBLAS / numpy) on the same operands.
- ``tuner``: ``tune(algo, target, dtype, shape, budget=…)``; ``tune_many`` (many shapes,
  compiling overlapped with measuring on a GPU), ``plan_points``, ``Prebuilder`` and
  ``load_prebuilt`` (build on one machine, measure on another).
- ``calibrate``: fit the profile's efficiencies to the log (``profile.with_calibration``).
- ``decide``: ``decide(M, N, K, dtype, target)``, the cost model's ``select`` fed with the
  log's measurements — GEMM, an LCMA, or the vendor GEMM (``vendor_matmul``).
- ``metrics``: Spearman rank correlation, trials to within 3% of the best, and the metrics
  over log records that ``scripts/eval_tuner.py`` reports.
"""
from .calibrate import Calibration, calibrate, calibrate_from_db
from ..artifact.tuning_log import TuningDB, best_config
from .decide import Decision, decide, vendor_matmul
from .metrics import space_report, spearman, trials_to_within
from .space import Point, Space, estimate, fit_check, ranked_space
from .tuner import Prebuilder, TuneResult, load_prebuilt, plan_points, tune, tune_many

__all__ = ["Calibration", "calibrate", "calibrate_from_db", "TuningDB", "best_config",
           "Decision", "decide", "vendor_matmul", "space_report", "spearman", "trials_to_within",
           "Point", "Space", "estimate", "fit_check", "ranked_space", "Prebuilder", "TuneResult",
           "load_prebuilt", "plan_points", "tune", "tune_many"]
