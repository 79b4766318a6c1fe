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
``to_dict()`` of ``lcmac.optimize``'s report, whose layers become ``?x<out>x<in>`` rules).
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
from lcmac.spec.shape_rules import parse_rule
from lcmac.policy import GEMM, EveryKernel, plan

#: a bundle holds every kernel its decisions choose: it is compiled for them
BUNDLE = EveryKernel("the bundle lcmac export compiles for these decisions")


def cases_from_json(path) -> list:
    """Shapes and rules from a JSON file (module doc)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise LcmacError(f"cannot read shapes from {path}: {e}") from None
    if isinstance(d, dict) and "swapped" in d:          # lcmac.optimize(...).to_dict()
        return [f"?x{s['shape'][1]}x{s['shape'][0]}" for s in d["swapped"]]
    if isinstance(d, dict):
        d = d.get("shapes")
    if not isinstance(d, list) or not d:
        raise ShapeError(f"{path} must hold a list of shapes or rules, {{\"shapes\": [...]}}, or "
                         "an lcmac.optimize report")
    return d


def decide(rule, t, dtype: str, rows, max_error, regime: str) -> tuple[str, str]:
    """(algorithm, why) for one case."""
    M = rule.M if rule.kind == "exact" else max(rows)
    p = plan(M, rule.N, rule.K, dtype, t.name, max_error=max_error, regime=regime, vendor=False,
             kernels=BUNDLE)
    if p.runs == GEMM:
        return GEMM, f"no LCMA predicted to win at {M}x{rule.N}x{rule.K}: {p.why}"
    return p.runs, p.why


def export(cases, target, dtype="float32", out_dir=".", *, rows=None, algo: str | None = None,
           max_error=None, regime: str = "burst", progress=None) -> Path:
    """Decide and build every case (shapes ``MxNxK`` or rules ``?xNxK``) into a bundle at
    ``out_dir`` with ``lcmac.h``; ``algo`` forces one algorithm for all.  Returns the index."""
    t = resolve_target(target)
    dtype = normalize_dtype(dtype)
    kind = backend_kind(t)
    specs, decisions = [], []
    for c in cases:
        rule = parse_rule(c)
        if rule.kind == "any":
            raise ShapeError("lcmac export takes shapes (MxNxK) and any-M rules (?xNxK); for "
                             "any shape use `lcmac build` without --shape")
        spec = plan_rule(rule, "gemm", kind, rows)
        a, why = (algo, "as asked (--algo)") if algo else decide(rule, t, dtype, spec.rows,
                                                                  max_error, regime)
        specs.append(replace(spec, algorithm=a))
        decisions.append({"rule": rule.text, "algorithm": a, "why": why})
        if progress:
            progress(f"{rule.text}: {a} ({why})")
    path = build_specs(specs, t, dtype, out_dir=out_dir, progress=progress,
                       extra={"decisions": decisions})
    inc = Path(c_include_dir())
    shutil.copy2(inc / "lcmac.h", path.parent / "lcmac.h")
    return path
