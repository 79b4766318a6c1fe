"""Measured CPU+GPU splits (``lcmac.tune.coexec_search``): one JSON object per line under
``<tuning logs>/splits/<target>-<dtype>.jsonl`` (beside the tuning logs, in a directory of its
own so that their readers never see these records; read from the same directories, written
to the same one: ``lcmac.artifact.tuning_log.default_dirs``)::

    {"schema": "lcmac-split/1", "target": "cuda-sm90a", "dtype": "bfloat16",
     "shape": [M, N, K], "inputs": "host", "gpu_mode": "bf16", "cpu_fraction": 0.03,
     "time_s": 0.0158, "gpu_only_s": 0.0161, "predicted_fraction": 0.029,
     "candidates": [[0.0, 0.0161], [0.029, 0.0158], ...], "device": "NVIDIA H100 …",
     "host_cpus": 16, "date": "…", "lcmac_version": "0.1.0"}

``cpu_fraction`` is the best split measured (0: GPU only); ``candidates`` every split timed.
A line that is not such a record is skipped with a warning, as in the tuning logs.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import warnings
from pathlib import Path

from lcmac.core.version import __version__
from lcmac.artifact.tuning_log import TuningLogWarning, default_dir, default_dirs

SCHEMA = "lcmac-split/1"
_REQUIRED = ("target", "dtype", "shape", "inputs", "gpu_mode", "cpu_fraction", "time_s")


def split_path(target: str, dtype: str, root: str | os.PathLike | None = None) -> Path:
    """Where a split record goes: under ``root``, else where new tuning-log records go."""
    return Path(root if root is not None else default_dir()) / "splits" / f"{target}-{dtype}.jsonl"


def make_split_record(**fields) -> dict:
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise ValueError(f"a split record needs {', '.join(missing)}")
    f = float(fields["cpu_fraction"])
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"cpu_fraction must lie in [0, 1], got {f}")
    return {"schema": SCHEMA, **fields, "shape": [int(x) for x in fields["shape"]],
            "cpu_fraction": f, "lcmac_version": __version__,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def append_split(rec: dict, root=None) -> Path:
    path = split_path(rec["target"], rec["dtype"], root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:      # one write: a whole line
        f.write(json.dumps(rec, sort_keys=True, allow_nan=False) + "\n")
    return path


def measured_split(target: str, dtype: str, shape, inputs: str, gpu_mode: str,
                   root=None, device: str | None = None) -> dict | None:
    """The latest record for exactly this case (measured on ``device`` where given: a split
    belongs to its GPU and host), or None."""
    dirs = [root] if root is not None else default_dirs()
    want = [int(x) for x in shape]
    found = None
    for path in (split_path(target, dtype, d) for d in dirs):    # a later directory's wins
        if path.is_file():
            found = _latest_in(path, want, inputs, gpu_mode, device) or found
    return found


def _latest_in(path: Path, want: list, inputs: str, gpu_mode: str, device: str | None) -> dict | None:
    found = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
            ok = rec.get("schema") == SCHEMA and all(k in rec for k in _REQUIRED)
        except ValueError:
            ok = False
        if not ok:
            warnings.warn(f"{path}:{n}: not an {SCHEMA} record; skipped", TuningLogWarning)
            continue
        if (rec["shape"] == want and rec["inputs"] == inputs and rec["gpu_mode"] == gpu_mode
                and 0.0 <= float(rec["cpu_fraction"]) <= 1.0
                and (device is None or rec.get("device") in (None, device))):
            found = rec
    return found
