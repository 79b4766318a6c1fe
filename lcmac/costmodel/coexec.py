"""One product split between a GPU and the host's CPU: which share of C's rows the CPU takes.

Rows ``[0, M_g)`` of C run on the GPU, rows ``[M_g, M)`` on the CPU; ``f = (M − M_g) / M`` is
the CPU's share.  With A of M×K, B of K×N, ``s`` bytes per element, ``r_g`` and ``r_c`` the two
devices' GEMM rates (FLOP/s), ``β`` the host link's bandwidth (bytes/s, each direction) and
``W = 2MNK``:

inputs on the host, C returned there::

    GPU   T_g(f) = max( (1−f)·W / r_g ,  ((1−f)·MK + KN + (1−f)·MN)·s / β )
    CPU   T_c(f) = f·W / r_c

  the GPU's copies run in chunks beside its GEMM, so the slower of the two paces it; B crosses
  the link whole, whatever the split.

inputs on the GPU, C left there::

    GPU   T_g(f) = (1−f)·W / r_g
    CPU   T_c(f) = (f·MK + KN + f·MN)·s / β + f·W / r_c

  the CPU's rows of A and all of B come down the link before it starts, its rows of C go back.

``T(f) = max(T_g(f), T_c(f))``.  T_g falls and T_c rises with f, so the best f is where they
cross (found by bisection); when the CPU is slower than the GPU alone even for a sliver
(``T_c`` at the crossing ≥ ``T_g(0)`` less the gain asked for) the split is 0 — GPU only.

Worked example (H100 SXM, bf16, inputs on the host, M = N = K = 8192, s = 2): r_g = 700 TFLOP/s,
a 16-core AVX-512 host at r_c = 2 TFLOP/s, β = 25 GB/s.  W = 1.10 TFLOP.  GPU only: compute
1.57 ms, copies 3·8192²·2 B / 25 GB/s = 16.1 ms, so T(0) = 16.1 ms (the link paces it).  With
f: copies (2(1−f)·134 MB + 134 MB) / 25 GB/s, CPU f·550 ms; they cross at f ≈ 0.029:
T = 15.8 ms, 1.020× — B's copy is the floor (5.4 ms) that no split removes, and the CPU's
3 % of the rows only spares the GPU 3 % of A's and C's copies.  Inputs already on the GPU: T(0) = 1.57 ms and the CPU cannot even receive B (5.4 ms)
in that time, so f = 0.
"""
from __future__ import annotations

from dataclasses import dataclass

INPUTS = ("host", "device")


@dataclass(frozen=True)
class SplitPrediction:
    """The model's split: the CPU's share of rows and the predicted times."""
    cpu_fraction: float
    t_gpu_only: float          # seconds, f = 0
    t_split: float             # seconds at cpu_fraction
    t_gpu: float               # the GPU side at cpu_fraction
    t_cpu: float               # the CPU side at cpu_fraction

    @property
    def speedup(self) -> float:
        return self.t_gpu_only / self.t_split

    def describe(self) -> str:
        if self.cpu_fraction == 0:
            return (f"GPU only: predicted {self.t_gpu_only * 1e3:.3f} ms; no CPU share gains "
                    f"(the CPU side would need more than that)")
        return (f"CPU takes {self.cpu_fraction:.1%} of the rows: predicted {self.t_split * 1e3:.3f} "
                f"ms against {self.t_gpu_only * 1e3:.3f} ms GPU only ({self.speedup:.3f}×)")


def side_times(f: float, M: int, N: int, K: int, itemsize: int, gpu_rate: float,
               cpu_rate: float, link_bw: float, inputs: str) -> tuple[float, float]:
    """(T_g(f), T_c(f)) in seconds (module doc)."""
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, not {inputs!r}")
    W = 2.0 * M * N * K
    g = 1.0 - f
    if inputs == "host":
        t_gpu = max(g * W / gpu_rate, (g * M * K + K * N + g * M * N) * itemsize / link_bw)
        t_cpu = f * W / cpu_rate
    else:
        t_gpu = g * W / gpu_rate
        t_cpu = ((f * M * K + K * N + f * M * N) * itemsize / link_bw + f * W / cpu_rate) if f else 0.0
    return t_gpu, t_cpu


def predict_split(M: int, N: int, K: int, itemsize: int, *, gpu_rate: float, cpu_rate: float,
                  link_bw: float, inputs: str = "host", min_gain: float = 0.01) -> SplitPrediction:
    """The CPU's share of C's rows that minimises the time (module doc); 0 unless it is
    predicted at least ``min_gain`` faster than the GPU alone."""
    for name, v in (("gpu_rate", gpu_rate), ("cpu_rate", cpu_rate), ("link_bw", link_bw)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
    args = (M, N, K, itemsize, gpu_rate, cpu_rate, link_bw, inputs)
    t0 = side_times(0.0, *args)[0]
    lo, hi = 0.0, 1.0
    for _ in range(60):                     # T_g − T_c falls with f: bisect its sign change
        mid = (lo + hi) / 2
        tg, tc = side_times(mid, *args)
        lo, hi = (mid, hi) if tg > tc else (lo, mid)
    f = hi
    tg, tc = side_times(f, *args)
    if max(tg, tc) > t0 * (1.0 - min_gain):
        return SplitPrediction(0.0, t0, t0, t0, 0.0)
    return SplitPrediction(f, t0, max(tg, tc), tg, tc)


def split_rows(M: int, cpu_fraction: float, align: int = 64) -> int:
    """M_g, the GPU's rows, for a CPU share: the CPU's rows rounded to a multiple of ``align``
    (whole tiles for both kernels); 0 CPU rows when the share rounds away."""
    if not 0.0 <= cpu_fraction <= 1.0:
        raise ValueError(f"the CPU's share must lie in [0, 1], got {cpu_fraction!r}")
    cpu_rows = int(round(cpu_fraction * M / align)) * align
    return M - min(cpu_rows, M)


#: the host link when nothing was measured: PCIe Gen5 x16 moves ~50 GB/s per direction on
#: paper; 25 GB/s is what pinned copies commonly reach (a prior: the search measures it)
DEFAULT_LINK_BW = 25e9


def host_cpu_rate(dtype: str, cores: int, flags: frozenset | set = frozenset(),
                  ghz: float = 2.0, efficiency: float = 0.6) -> float:
    """A prior for the host's GEMM FLOP/s: cores × 2 FMA ports × lanes × 2 × clock ×
    efficiency, lanes from the widest vector unit in ``flags`` (/proc/cpuinfo); float64 at half
    the float32 lanes; bf16/fp16 at the float32 rate, twice it with AVX512-BF16, eight times
    with AMX (the library's kernels convert or use them).  The clock and efficiency are
    assumptions; the measured search replaces the whole figure."""
    bits = 512 if "avx512f" in flags else 256 if "avx2" in flags else 128
    fp32 = cores * 2 * (bits // 32) * 2 * ghz * 1e9 * efficiency
    if dtype == "float64":
        return fp32 / 2
    if dtype in ("bfloat16", "float16"):
        return fp32 * (8 if "amx_bf16" in flags else 2 if "avx512_bf16" in flags else 1)
    return fp32


#: the least predicted gain for which the measured-sides model splits: its inputs are timings
#: whose round-to-round spread on the H100 host was several per cent, so a smaller predicted
#: gain is within their noise (and a split that loses costs more than one that wins gains)
MEASURED_MIN_GAIN = 0.05


def predict_split_measured(M: int, t_gpu_only: float, gpu_fixed_s: float, cpu_fixed_s: float,
                           cpu_row_s: float, *, align: int = 64,
                           min_gain: float = MEASURED_MIN_GAIN) -> SplitPrediction:
    """The split from measured sides — what the rate model above leaves out (the GPU's copies
    not fully hidden, the CPU's pool waking, small slices running below the CPU's rate, the two
    sides sharing the machine) is in the measurements:

        T_g(f) = g + (1 − f)·(T₀ − g)        T₀ the GPU alone, g its part no split removes
                                             (B's copy for host inputs; 0 on the GPU)
        T_c(f) = c + f·M·t_row  (f > 0)      c and t_row from the CPU side of two split runs

    The lines cross at f = (T₀ − c) / (T₀ − g + M·t_row); the CPU's rows are rounded to
    ``align`` and the split kept only if predicted ``min_gain`` (``MEASURED_MIN_GAIN``) faster
    than T₀."""
    if M <= 0 or t_gpu_only <= 0:
        raise ValueError("M and the GPU-only time must be positive")
    g, c, r = max(0.0, min(gpu_fixed_s, t_gpu_only)), max(0.0, cpu_fixed_s), max(0.0, cpu_row_s)

    def sides(f):
        return g + (1 - f) * (t_gpu_only - g), (c + f * M * r) if f > 0 else 0.0

    f = (t_gpu_only - c) / (t_gpu_only - g + M * r) if t_gpu_only - g + M * r > 0 else 0.0
    f = (M - split_rows(M, min(1.0, max(0.0, f)), align)) / M
    tg, tc = sides(f)
    if f == 0 or max(tg, tc) > t_gpu_only * (1 - min_gain):
        return SplitPrediction(0.0, t_gpu_only, t_gpu_only, t_gpu_only, 0.0)
    return SplitPrediction(f, t_gpu_only, max(tg, tc), tg, tc)
