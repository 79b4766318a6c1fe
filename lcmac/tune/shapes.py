"""Shape lists for tuning: the LLM linear layers of ``llm_shapes.json`` (copied into the
package from the project's shared benchmark list; its ``origin`` field says so)."""
from __future__ import annotations

import json
from pathlib import Path

_FILE = Path(__file__).with_name("llm_shapes.json")


def llm_shapes(ms=None, models=None, limit: int | None = None) -> list[tuple[str, tuple[int, int, int]]]:
    """[(label, (M, N, K))] for every model layer (N = out features, K = in features) at each
    token count M (default: the file's quick tuning subset ``M_tune``), duplicates removed."""
    doc = json.loads(_FILE.read_text())
    ms = list(ms) if ms is not None else doc["M_tune"]
    out, seen = [], set()
    for model, d in doc["models"].items():
        if models and model not in models:
            continue
        for layer, (n, k) in d["NK"].items():
            for m in ms:
                s = (int(m), int(n), int(k))
                if s not in seen:
                    seen.add(s)
                    out.append((f"{model}/{layer}", s))
    return out[:limit] if limit else out
