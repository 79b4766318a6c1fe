"""The analytic cost model: hardware profiles, the per-stage LCMA model (FalconGEMM's
Table II, Eq. 8–10, re-derived), GPU wave quantisation and on-chip fit, the accuracy model
(`accuracy.error_ratio`: the error an LCMA adds, simulated at the kernels' rounding points),
the decision (`select`, `decide_by_model`) that ranks plain GEMM against every applicable
catalogue algorithm, optionally within an error budget, and the per-config estimates the
tuner ranks its search space with (`config_estimates.estimate`, `config_estimates.fit_check`;
`model_dtype`: the dtype a target's kernels are priced in, CUDA float32 = TF32)."""
from lcmac.costmodel.accuracy import ErrorEstimate, error_ratio
from lcmac.costmodel.config_estimates import model_dtype
from lcmac.costmodel.decision import (
    SCHEMA, Candidate, candidate_names, decide_by_model, resolve_profile, select)
from lcmac.spec.profiles import (
    PROFILES, TARGET_PROFILES, HardwareProfile, get_profile, profile_for_target, profile_names)
from lcmac.costmodel.stages import (
    STAGES, AlgQuantities, Estimate, StageCost, gemm_estimate, gemm_intensity,
    gemm_is_memory_bound, lcma_estimate, quantities, stage_table)
from lcmac.costmodel.waves import (
    SCHEDULES, FitReport, WaveAnalysis, onchip_fit, wave_analysis, waves_for)

__all__ = [
    "ErrorEstimate", "error_ratio",
    "model_dtype",
    "SCHEMA", "Candidate", "candidate_names", "decide_by_model", "resolve_profile", "select",
    "PROFILES", "TARGET_PROFILES", "HardwareProfile", "get_profile",
    "profile_for_target", "profile_names",
    "STAGES", "AlgQuantities", "Estimate", "StageCost", "gemm_estimate", "gemm_intensity",
    "gemm_is_memory_bound", "lcma_estimate", "quantities", "stage_table",
    "SCHEDULES", "FitReport", "WaveAnalysis", "onchip_fit", "wave_analysis", "waves_for",
]
