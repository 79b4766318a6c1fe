"""How a product shared by the GPU and the host's CPU is split (``lcmac.api.coexec``).

``choose_split`` gives the CPU's share of C's rows: the one asked for, else the best split
measured for this case (``lcmac.artifact.split_log``: per target, GPU, dtype, shape, where the
inputs are and the GPU's number format), else none: the GPU alone.  The uncalibrated model
(``model_split``: the GPU's profile, a prior for the host's cores, the default link) is only
quoted in the reason, because it has put work on the CPU where that made the product many
times slower.
"""
from __future__ import annotations

from dataclasses import dataclass

from lcmac.artifact.split_log import measured_split
from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import LcmacError
from lcmac.costmodel.coexec import DEFAULT_LINK_BW, host_cpu_rate, predict_split
from lcmac.runtime.loader import host_cpus
from lcmac.spec.cpu.x86 import host_flags
from lcmac.spec.profiles import profile_for_target

__all__ = ["SplitChoice", "choose_split", "model_split"]


@dataclass(frozen=True)
class SplitChoice:
    cpu_fraction: float
    source: str            # "measured", "unmeasured", "asked"; "model" from model_split
    why: str


def _gpu_name() -> str | None:
    import torch            # a split runs torch tensors; asked only for one
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def model_split(M, N, K, dtype: str, mode: str, inputs: str, target) -> SplitChoice:
    """The model's split with the GPU profile of ``target`` and this host's prior."""
    prof = profile_for_target(target)
    gpu_rate = prof.achievable_mul("tfloat32" if mode == "tf32" else dtype)
    cpu_rate = host_cpu_rate(dtype, host_cpus(), host_flags())
    p = predict_split(M, N, K, ITEMSIZE[dtype], gpu_rate=gpu_rate, cpu_rate=cpu_rate,
                      link_bw=DEFAULT_LINK_BW, inputs=inputs)
    return SplitChoice(p.cpu_fraction, "model", p.describe() + f" ({prof.name} profile, "
                       f"{host_cpus()} host cores at a prior {cpu_rate / 1e12:.2f} TFLOP/s, link "
                       f"{DEFAULT_LINK_BW / 1e9:.0f} GB/s)")


def choose_split(M, N, K, dtype: str, mode: str, inputs: str, target, split="auto") -> SplitChoice:
    """The CPU's share of rows for this case (module doc): ``split`` itself unless "auto";
    ``mode`` the GPU's number format, ``inputs`` "host" or "device"."""
    if split != "auto":
        f = float(split)
        if not 0.0 <= f <= 1.0:
            raise LcmacError(f"split is the CPU's share of rows, in [0, 1]; got {split!r}")
        return SplitChoice(f, "asked", f"CPU share {f:.1%} as asked")
    rec = measured_split(target.name, dtype, (M, N, K), inputs, mode, device=_gpu_name())
    if rec is not None:
        return SplitChoice(float(rec["cpu_fraction"]), "measured",
                           f"measured best split {rec['cpu_fraction']:.1%}: {rec['time_s'] * 1e3:.3f} "
                           f"ms against {rec.get('gpu_only_s', float('nan')) * 1e3:.3f} ms GPU only "
                           f"on {rec.get('device', '?')} ({rec.get('date', '?')})")
    prior = model_split(M, N, K, dtype, mode, inputs, target)
    return SplitChoice(0.0, "unmeasured", "GPU only: no measured split for this case "
                       "(scripts/bench_coexec.py measures and logs one); the uncalibrated model "
                       f"would say: {prior.why}")
