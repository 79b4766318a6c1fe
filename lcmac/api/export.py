"""``lcmac export``: the kernels a set of shapes needs, decided and compiled ahead of time into
one bundle (``lcmac.artifact.bundle``) with the C header beside it, for a machine that has no
compiler.

    lcmac.api.export(["4096x4096x4096", "?x8192x8192"], "x86_64-avx512", "float32", "bundle/")

What each case gets: ``lcmac.policy.plan``'s decision among lcmac's own kernels (the vendor
left out: a bundle runs with no vendor library; the tuning logs, else the model) at that
shape, or for a ``?xNxK`` rule at its largest row bucket: an LCMA where one is predicted to
win, else lcmac's plain GEMM.  The index records
each decision and why.  Cases come from the
command line, a JSON file (a list of shapes/rules, ``{"shapes": [...]}``, or the
``to_dict()`` of an older ``lcmac.optimize`` report, whose layers become ``?x<out>x<in>`` rules).

An ``lcmac.optimize`` report saved as JSON (``report.save(path)``, schema ``REPORT_SCHEMA``)
names the kernels its swapped layers run: ``export_report`` decides nothing and builds exactly
those, one ``?xNxK`` rule per layer shape and algorithm whose row ladder is the buckets named.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from lcmac.artifact.bundle import backend_kind, build_specs, plan_rule
from lcmac.artifact.build import resolve_target
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import LcmacError, ShapeError
from lcmac.runtime import c_include_dir
from lcmac.spec.precision import DEFAULT_PRECISION, operand_modes
from lcmac.spec.shape_rules import parse_rule
from lcmac.policy import GEMM, EveryKernel, plan

#: a bundle holds every kernel its decisions choose: it is compiled for them
BUNDLE = EveryKernel("the bundle lcmac export compiles for these decisions")


#: the schema of an ``lcmac.optimize`` report that names its kernels (``OptimizeReport.to_dict``)
REPORT_SCHEMA = "lcmac-optimize/1"


def _read_json(path, what: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise LcmacError(f"cannot read {what} from {path}: {e}") from None


def cases_from_json(path) -> list:
    """Shapes and rules from a JSON file (module doc)."""
    d = _read_json(path, "shapes")
    if isinstance(d, dict) and "swapped" in d:          # lcmac.optimize(...).to_dict()
        return [f"?x{s['shape'][1]}x{s['shape'][0]}" for s in d["swapped"]]
    if isinstance(d, dict):
        d = d.get("shapes")
    if not isinstance(d, list) or not d:
        raise ShapeError(f"{path} must hold a list of shapes or rules, {{\"shapes\": [...]}}, or "
                         "an lcmac.optimize report")
    return d


def decide(rule, t, dtype: str, rows, max_error, regime: str,
           precision: str | None = None) -> tuple[str, str]:
    """(algorithm, why) for one case."""
    M = rule.M if rule.kind == "exact" else max(rows)
    p = plan(M, rule.N, rule.K, dtype, t.name, max_error=max_error, regime=regime, vendor=False,
             kernels=BUNDLE, precision=precision)
    if p.runs == GEMM:
        return GEMM, f"no LCMA predicted to win at {M}x{rule.N}x{rule.K}: {p.why}"
    return p.runs, p.why


def export(cases, target, dtype="float32", out_dir=".", *, rows=None, algo: str | None = None,
           max_error=None, precision: str | None = None, regime: str = "burst",
           progress=None) -> Path:
    """Decide and build every case (shapes ``MxNxK`` or rules ``?xNxK``) into a bundle at
    ``out_dir`` with ``lcmac.h``; ``algo`` forces one algorithm for all.  ``max_error``: the
    error budget (None: the dtype's default; inf: none); ``precision``: the float32 class
    (``lcmac.spec.precision``, default "highest"), whose operand mode the kernels are built
    in.  Returns the index."""
    t = resolve_target(target)
    dtype = normalize_dtype(dtype)
    operands = operand_modes(t.name, dtype, precision or DEFAULT_PRECISION)[0]
    kind = backend_kind(t)
    specs, decisions = [], []
    for c in cases:
        rule = parse_rule(c)
        if rule.kind == "any":
            raise ShapeError("lcmac export takes shapes (MxNxK) and any-M rules (?xNxK); for "
                             "any shape use `lcmac build` without --shape")
        spec = plan_rule(rule, "gemm", kind, rows)
        a, why = (algo, "as asked (--algo)") if algo else decide(rule, t, dtype, spec.rows,
                                                                  max_error, regime, precision)
        specs.append(replace(spec, algorithm=a))
        decisions.append({"rule": rule.text, "algorithm": a, "why": why})
        if progress:
            progress(f"{rule.text}: {a} ({why})")
    path = build_specs(specs, t, dtype, out_dir=out_dir, progress=progress,
                       config=None if operands == "native" else {"operands": operands},
                       extra={"decisions": decisions})
    return _with_header(path)


def _with_header(index: Path) -> Path:
    """``index`` after copying the C header beside it."""
    shutil.copy2(Path(c_include_dir()) / "lcmac.h", index.parent / "lcmac.h")
    return index


def report_from_json(path) -> dict | None:
    """The ``lcmac.optimize`` report in the JSON file ``path`` (``OptimizeReport.save``), or
    None where the file holds something else (shapes: ``cases_from_json``)."""
    d = _read_json(path, "an lcmac.optimize report")
    return d if isinstance(d, dict) and d.get("schema") == REPORT_SCHEMA else None


def _named_kernels(report: dict, dtype: str | None) -> list[dict]:
    """The kernels the report's swapped layers name, of ``dtype`` where given; all of one
    target, dtype and operand mode (one bundle), else LcmacError saying which."""
    kernels = [k for s in report.get("swapped") or () for k in s.get("kernels") or ()]
    if dtype is not None:
        kernels = [k for k in kernels if k["dtype"] == dtype]
    if not kernels:
        of = f" of {dtype}" if dtype else ""
        raise LcmacError(f"the lcmac.optimize report names no kernel{of} to export "
                         f"({report.get('why', 'no layer swapped')})")
    for field, fix in (("target", "export on one target at a time"),
                       ("dtype", "pass --dtype to export one"),
                       ("operands", "export one operand mode at a time")):
        seen = sorted({str(k.get(field, "native")) for k in kernels})
        if len(seen) > 1:
            raise LcmacError(f"the report names kernels of {len(seen)} {field}s "
                             f"({', '.join(seen)}); a bundle holds one: {fix}")
    return kernels


def export_report(report: dict, out_dir=".", *, target=None, dtype=None, progress=None) -> Path:
    """Build exactly the kernels an ``lcmac.optimize`` report names (``report_from_json``) into a
    bundle at ``out_dir`` with ``lcmac.h`` (module doc); ``target`` and ``dtype``, where given,
    must be (and select) the report's.  Returns the index."""
    kernels = _named_kernels(report, None if dtype is None else normalize_dtype(dtype))
    t = resolve_target(kernels[0]["target"])
    if target is not None and resolve_target(target).name != t.name:
        raise LcmacError(f"the report's kernels are for {t.name}, not "
                         f"{resolve_target(target).name}")
    ladders: dict[tuple, set] = {}
    for k in kernels:
        M, N, K = k["shape"]
        ladders.setdefault((N, K, k["algorithm"]), set()).add(M)
    specs, decisions = [], []
    for (N, K, algo), rows in ladders.items():
        spec = plan_rule(f"?x{N}x{K}", algo, backend_kind(t), tuple(sorted(rows, reverse=True)))
        specs.append(spec)
        decisions.append({"rule": spec.rule.text, "algorithm": algo,
                          "why": "named by the lcmac.optimize report"})
        if progress:
            progress(f"{spec.rule.text}: {algo} (named by the lcmac.optimize report)")
    operands = kernels[0].get("operands", "native")
    path = build_specs(specs, t, kernels[0]["dtype"], out_dir=out_dir, progress=progress,
                       config=None if operands == "native" else {"operands": operands},
                       extra={"decisions": decisions})
    return _with_header(path)
