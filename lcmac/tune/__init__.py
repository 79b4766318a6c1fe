"""The autotuner and its tuning-log database (``tuning_logs/<target>-<dtype>.jsonl``).

- ``space``: enumerate a template's configs, prune those that cannot fit on chip, rank the
  rest with an analytic per-config estimate.
- ``db``: the JSON Lines log; ``best_config(target, dtype, algo_hash, shape)``.
- ``measure``: timing an artifact in an isolated process (median of repeats, warm-up).
- ``tuner``: ``tune(algo, target, dtype, shape, budget=…)``.
- ``calibrate``: fit the profile's efficiencies to the log (``profile.with_calibration``).
- ``decide``: ``decide(M, N, K, dtype, target)``, the cost model's ``select`` fed with the
  log's measurements.
- ``metrics``: Spearman rank correlation, trials to within 3% of the best.
"""
from .calibrate import Calibration, calibrate, calibrate_from_db
from .db import TuningDB, best_config
from .decide import Decision, decide
from .metrics import space_report, spearman, trials_to_within
from .space import Point, Space, estimate, fit_check, ranked_space
from .tuner import TuneResult, tune

__all__ = ["Calibration", "calibrate", "calibrate_from_db", "TuningDB", "best_config",
           "Decision", "decide", "space_report", "spearman", "trials_to_within", "Point",
           "Space", "estimate", "fit_check", "ranked_space", "TuneResult", "tune"]
