"""The schedule families and what the tuner and the tuning log ask of each: its config
class, the generation of its templates, its default config and, where it has one, its own
config space.  Config modules only: importing this never imports a compiler (the CUDA
templates import TileLang, which must never share a process with apache-tvm)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lcmac.spec.cpu import config as cpu_config
from lcmac.spec.cuda import config as cuda_config


@dataclass(frozen=True)
class ScheduleFamily:
    name: str                          # "cpu" | "cuda"
    config_class: type
    #: generation of the templates; tuning records of an older one timed other code
    schedule_version: int
    default_config: Callable           # (target, dtype, algorithm, shape=) -> config
    config_space: Callable | None      # (target, dtype, shape, algorithm) -> [config]; None: the tuner's grid


FAMILIES: dict[str, ScheduleFamily] = {
    "cpu": ScheduleFamily("cpu", cpu_config.CpuConfig, cpu_config.SCHEDULE_VERSION,
                          cpu_config.default_config, cpu_config.config_space),
    "cuda": ScheduleFamily("cuda", cuda_config.CudaConfig, cuda_config.SCHEDULE_VERSION,
                           cuda_config.default_config, None),
}
