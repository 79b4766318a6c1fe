"""What the ``lcmac`` commands print: JSON documents with their schema names, aligned tables,
byte sizes."""
from __future__ import annotations

import json

JSON_SCHEMAS = {"list": "lcmac-list/1", "show": "lcmac-show/1", "verify": "lcmac-verify/1",
                "select": "lcmac-select/1", "cache-info": "lcmac-cache-info/1",
                "cache-list": "lcmac-cache-list/1", "distribute": "lcmac-distribute/1"}


def dump_json(kind: str, payload: dict) -> None:
    """``payload`` as JSON on stdout, tagged with the schema of ``kind`` (docs/cli.md)."""
    print(json.dumps({"schema": JSON_SCHEMAS[kind], **payload}, indent=2, default=str))


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
