"""What the ``lcmac`` commands print: JSON documents with their schema names, aligned tables,
byte sizes."""
from __future__ import annotations

import json
import math

JSON_SCHEMAS = {"list": "lcmac-list/1", "show": "lcmac-show/1", "verify": "lcmac-verify/1",
                "select": "lcmac-select/1", "cache-info": "lcmac-cache-info/1",
                "cache-list": "lcmac-cache-list/1", "distribute": "lcmac-distribute/1",
                "build": "lcmac-build/1", "export": "lcmac-export/1", "tune": "lcmac-tune/1",
                "calibrate": "lcmac-calibrate/1"}


def _nan_as_null(x):
    """``x`` with every NaN (a value not measured or not defined) made null: JSON has no NaN,
    and tools that read strict JSON reject Python's.  Infinities stay: they mean something
    (``max_error`` inf: no budget)."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_as_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_as_null(v) for v in x]
    return x


def dump_json(kind: str, payload: dict) -> None:
    """``payload`` as JSON on stdout, tagged with the schema of ``kind`` (docs/cli.md)."""
    print(json.dumps(_nan_as_null({"schema": JSON_SCHEMAS[kind], **payload}), indent=2,
                     default=str))


def add_json_argument(parser, kind: str) -> None:
    """``--json``: the command's result as one ``lcmac-KIND/1`` object on stdout; progress
    stays on stderr."""
    parser.add_argument("--json", action="store_true",
                        help=f"machine-readable output: one JSON object on stdout (schema "
                             f"{JSON_SCHEMAS[kind]}); progress goes to stderr")


def table(rows: list[list], header: list[str]) -> str:
    """Rows under a header, columns aligned (the first left, the others right)."""
    cols = [header] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cols) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(header), "  ".join("-" * x for x in w)] + [line(r) for r in cols[1:]])


def size_text(n: int) -> str:
    """Bytes as B / KB / MB / GB (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
