"""The autotuner and the decision that prefers measurements.

- ``space``: enumerate a template's configs, prune those that cannot fit on chip, rank the
  rest with the cost model's per-config estimate (``lcmac.costmodel.config_estimates``).
- ``tuner``: ``tune(algo, target, dtype, shape, budget=…)`` — plan → build → measure → log,
  its options grouped in ``TuneOptions``; ``tune_many`` (many shapes, compiling overlapped
  with measuring on a GPU) and ``plan_points``.
- ``builders``: compiling the planned points (``Builder``), ahead of measuring too
  (``Prebuilder``, ``load_prebuilt``: build on one machine, measure on another).
- ``measure``: timing an artifact in an isolated process (median of repeats, warm-up), and
  the vendor GEMM (cuBLAS / numpy) on the same operands.
- ``calibrate``: fit the profile's efficiencies to the log (``profile.with_calibration``).
- ``measured_decision``: ``decide_by_measurement(M, N, K, dtype, target)``, the cost model's
  ``select`` fed with the log's measurements — GEMM, an LCMA, or the vendor GEMM
  (``vendor_matmul``).
- ``metrics``: Spearman rank correlation, trials to within 3% of the best, and the metrics
  over log records that ``scripts/eval_tuner.py`` reports.

The tuning log itself (``tuning_logs/<target>-<dtype>.jsonl``) is ``lcmac.artifact.tuning_log``.
"""
from ..artifact.tuning_log import TuningDB, best_config
from .builders import Prebuilder, load_prebuilt
from .calibrate import Calibration, calibrate, calibrate_from_db
from .measured_decision import Decision, decide_by_measurement, vendor_matmul
from .metrics import space_report, spearman, trials_to_within
from .space import Point, Space, ranked_space
from .tuner import TuneOptions, TuneResult, plan_points, tune, tune_many, tune_with

__all__ = ["Calibration", "calibrate", "calibrate_from_db", "TuningDB", "best_config",
           "Decision", "decide_by_measurement", "vendor_matmul", "space_report", "spearman",
           "trials_to_within", "Point", "Space", "ranked_space", "Prebuilder", "TuneOptions",
           "TuneResult", "load_prebuilt", "plan_points", "tune", "tune_many", "tune_with"]
