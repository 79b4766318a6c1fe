"""The one place lcmac decides what runs.

The cost model prices (``lcmac.costmodel.select`` ranks the plain GEMM and every applicable
LCMA), the tuning logs measure (``lcmac.artifact.tuning_log``), and policy decides:

- ``plans``: ``Plan``, what runs for one product and why (every decision below returns one);
- ``measured``: the decision from the logs' measurements, the model filling the gaps
  (``decide_by_measurement``);
- ``planner``: ``plan(M, N, K, dtype, target, algo=, max_error=, precision=, regime=)``, the
  decision settled for the caller's kernels, within an error budget (by default the dtype's)
  and float32's precision class: what ``lcmac.matmul``, ``lcmac.auto``, ``lcmac.optimize``,
  ``lcmac select`` and ``lcmac export`` run;
- ``split``: the CPU's share of a product split between the GPU and the CPU;
- ``batched``: which batched GEMM ``lcmac.bmm(algo="auto")`` runs.
"""
from lcmac.policy.batched import BATCHED_WINS, choose_batched
from lcmac.policy.measured import REGIMES, check_regime, decide_by_measurement
from lcmac.policy.planner import EveryKernel, KernelSource, gemm_beats_vendor, plan
from lcmac.policy.plans import AUTO, GEMM, JIT, VENDOR, Piece, Plan
from lcmac.policy.split import SplitChoice, choose_split

__all__ = ["AUTO", "BATCHED_WINS", "EveryKernel", "GEMM", "JIT", "KernelSource", "Piece", "Plan",
           "REGIMES", "SplitChoice", "VENDOR", "check_regime", "choose_batched", "choose_split",
           "decide_by_measurement", "gemm_beats_vendor", "plan"]
