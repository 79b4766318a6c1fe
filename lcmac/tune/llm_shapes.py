"""Shape lists for tuning: the LLM linear layers of ``llm_shapes.json`` (copied into the
package from ``bench/llm_shapes.json``; its ``origin`` field says so).

- ``llm_shapes(ms)``: every distinct (N, K) of the three models at each token count M
  (default: the file's quick tuning subset ``M_tune``).
- ``llm_cpu_shapes()``: a subset a 2-core CPU can tune in minutes rather than hours (see its
  doc): the layers whose M·N·K at M = 512 is at most ``max_gflop`` GFLOP.
"""
from __future__ import annotations

import json
from pathlib import Path

_FILE = Path(__file__).with_name("llm_shapes.json")


def _doc() -> dict:
    return json.loads(_FILE.read_text())


def llm_shapes(ms=None, models=None, limit: int | None = None) -> list[tuple[str, tuple[int, int, int]]]:
    """[(label, (M, N, K))] for every model layer (N = out features, K = in features) at each
    token count M (default: the file's quick tuning subset ``M_tune``), duplicates removed
    (the label is the first layer with that (N, K))."""
    doc = _doc()
    ms = list(ms) if ms is not None else doc["M_tune"]
    out, seen = [], set()
    for m in ms:
        for model, d in doc["models"].items():
            if models and model not in models:
                continue
            for layer, (n, k) in d["NK"].items():
                s = (int(m), int(n), int(k))
                if s not in seen:
                    seen.add(s)
                    out.append((f"{model}/{layer}", s))
    return out[:limit] if limit else out


#: token counts of the CPU subset (``lcmac tune --shapes llm-cpu``)
CPU_M = (512,)


def llm_cpu_shapes(ms=None, max_gflop: float = 80.0, limit: int | None = None):
    """The LLM layers small enough to tune on a small CPU: at each M (default 512) the
    distinct (N, K) with 2·M·N·K ≤ ``max_gflop`` GFLOP (one GEMM well under a second on a
    2-core CPU, so a config's build + check + timed repeats stay within seconds; the
    vocabulary projections and the 18432-wide MLPs are left out)."""
    out = [(lab, s) for lab, s in llm_shapes(ms if ms is not None else CPU_M)
           if 2.0 * s[0] * s[1] * s[2] <= max_gflop * 1e9]
    return out[:limit] if limit else out
