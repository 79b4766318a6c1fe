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
- ``metrics``: Spearman rank correlation, trials to within 3% of the best, and the metrics
  over log records that ``scripts/eval_tuner.py`` reports.

The tuning log itself (``tuning_logs/<target>-<dtype>.jsonl``) is ``lcmac.artifact.tuning_log``.
"""
from lcmac.artifact.tuning_log import TuningDB, best_config
from lcmac.tune.builders import Prebuilder, load_prebuilt
from lcmac.tune.calibrate import Calibration, calibrate, calibrate_from_db
from lcmac.tune.metrics import space_report, spearman, trials_to_within
from lcmac.tune.space import Point, Space, ranked_space
from lcmac.tune.tuner import TuneOptions, TuneResult, plan_points, tune, tune_many, tune_with

__all__ = ["Calibration", "calibrate", "calibrate_from_db", "TuningDB", "best_config",
           "space_report", "spearman",
           "trials_to_within", "Point", "Space", "ranked_space", "Prebuilder", "TuneOptions",
           "TuneResult", "load_prebuilt", "plan_points", "tune", "tune_many", "tune_with"]
