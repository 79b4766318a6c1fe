"""Bundles: one directory of kernels serving shape rules, with one index.

    DIR/bundle.json               the index (below), written last and atomically
    DIR/<kernel>.so, <kernel>.json  ordinary artifacts (lcmac.artifact.manifest), one per
                                  bucket shape

``build_bundle(algo, target, dtype, rules)`` compiles every bucket kernel the rules need
(``lcmac.spec.shape_rules``: ``?xNxK`` → a row ladder of N×K kernels; ``?x?x?`` → a row ladder of
T_N×T_K tiles; ``MxNxK`` → that kernel) with one compiler process, then writes the index.
``lcmac build`` without ``--shape`` writes a bundle of the any-shape rule; with ``--shape
?xNxK`` one of that rule.  ``lcmac.load(DIR)`` runs it (``lcmac.runtime.bundle``).  For a CPU
in float32 or float64 the any-shape rule is served by *piece* kernels instead of copied
tiles: one per (P_M, P_N, P_K) of a ladder per dimension, taking views of A, B and C
(``lcmac.spec.shape_rules.plan_pieces``, ``lcmac.runtime.bundle_pieces``); such a bundle has
format ``lcmac-bundle/3`` (the rule's ``pieces`` with ``run_time``: kernels of run-time
rows and depth, the kernels' ``piece``), which readers of ``lcmac-bundle/1`` and ``/2``
refuse by its format.  ``lcmac-bundle/2`` (piece kernels of fixed sizes, no ``run_time``) is
still read.  On a CUDA target (a dtype with TMA copies, no row ladder or tile asked for) the
any-shape rule is served by one kernel per algorithm whose M, N and K are run-time values
(``CudaConfig.dynamic_shape``, the rule's ``dynamic_shape``: the largest M, N, K a launch
takes; ``lcmac.runtime.bundle`` runs more rows as launches along M and pads N or K that are
not multiples of 16 bytes); such a bundle has format ``lcmac-bundle/4``, which readers of
the earlier formats refuse by its format.

Index fields (format ``lcmac-bundle/1``; ``/2`` adds ``pieces`` and ``piece``, ``/3`` the
pieces' ``run_time``, ``/4`` ``dynamic_shape``):

    format, lcmac_version, created
    target          {name, family, backend}
    dtype
    rules           [{rule, algorithm, rows: [P...], tile: [T_N, T_K] | null,
                      kernels: [kernel name...], dynamic_rows: true (only where set: one
                      kernel of run-time M, rows[0] a launch),
                      pieces: {M: [P...], N: [P...], K: [P...], run_time: {M: u, K: u}} (only
                      where set: the any rule's piece ladders; run_time: the kernels take up
                      to P_M rows and P_K depth, multiples of u, at run time; rows [] and
                      tile null),
                      dynamic_shape: [M, N, K] (only where set: one kernel of run-time M, N
                      and K taking up to that shape a launch; rows [] and tile null)}]
                                                  in the order the runtime tries them
    kernels         [{name, algorithm: {name, hash}, shape: {M, N, K}, config, entry,
                      manifest, library, sha256, bytes, piece: true (only where set)}]
                     (library sha256 and size: as in the kernel's manifest, so a reader can
                     check a library before loading it)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import ArtifactError, LcmacError
from lcmac.spec.shape_rules import (
    ANY_MAX_SHAPE, ANY_ROWS, ANY_TILE, BUILD_ROWS, PIECE_DTYPES, ShapeRule, bucket_shapes, check_ladder, parse_rule,
    piece_ladders, piece_shapes)
from lcmac.core.version import __version__
from lcmac.spec.cpu.config import default_config, default_threads
from lcmac.artifact.build import build_many, resolve_algorithm, resolve_target
from lcmac.artifact.manifest import Manifest, atomic_write_bytes

FORMAT = "lcmac-bundle/1"
#: the format of a bundle with piece kernels of run-time rows and depth (``pieces``' ``run_time``)
PIECES_FORMAT = "lcmac-bundle/3"
#: the format of a bundle with piece kernels of fixed sizes (read, no longer written)
FIXED_PIECES_FORMAT = "lcmac-bundle/2"
#: the format of a bundle with a CUDA any-shape rule served by one kernel of run-time M, N, K
SHAPE_FORMAT = "lcmac-bundle/4"
READ_FORMATS = (FORMAT, FIXED_PIECES_FORMAT, PIECES_FORMAT, SHAPE_FORMAT)
INDEX = "bundle.json"


@dataclass(frozen=True)
class RuleSpec:
    """One rule of a bundle: the rule, the algorithm serving it, its row ladder and tile."""
    rule: ShapeRule
    algorithm: str
    rows: tuple = ()
    tile: tuple | None = None
    kernels: tuple = ()
    dynamic_rows: bool = False      # rows rule: one CUDA kernel of run-time M (rows[0] a launch)
    pieces: dict | None = None      # any rule on a CPU: {"M", "N", "K"} piece ladders, "run_time"
    dynamic_shape: tuple | None = None  # any rule on CUDA: one kernel of run-time M, N, K up to these

    def to_dict(self) -> dict:
        d = {"rule": self.rule.text, "algorithm": self.algorithm, "rows": list(self.rows),
             "tile": list(self.tile) if self.tile else None, "kernels": list(self.kernels)}
        if self.pieces:
            d["pieces"] = {dim: list(self.pieces[dim]) for dim in "MNK"}
            if self.pieces.get("run_time"):
                d["pieces"]["run_time"] = dict(self.pieces["run_time"])
        if self.dynamic_shape:
            d["dynamic_shape"] = list(self.dynamic_shape)
        return dict(d, dynamic_rows=True) if self.dynamic_rows else d

    def shapes(self) -> list[tuple[int, int, int]]:
        """The (M, N, K) of the rule's kernels: its buckets, for ``dynamic_rows`` the one
        kernel taking up to the largest bucket's rows a launch, for ``dynamic_shape`` the one
        kernel taking up to that shape."""
        if self.dynamic_shape:
            return [tuple(self.dynamic_shape)]
        if self.dynamic_rows:
            return [(self.rows[0], self.rule.N, self.rule.K)]
        if self.pieces:
            return piece_shapes(self.pieces)
        return bucket_shapes(self.rule, self.rows, self.tile)


@dataclass
class Bundle:
    """A bundle's index, read and checked."""
    path: Path
    target: dict
    dtype: str
    rules: list
    kernels: dict = field(default_factory=dict)      # name → index entry
    lcmac_version: str = ""

    def manifest_path(self, name: str) -> Path:
        return self.path / self.kernels[name]["manifest"]


def backend_kind(target) -> str:
    """"cuda" for TileLang targets, "cpu" for the others (which ladder defaults apply)."""
    return "cuda" if resolve_target(target).backend == "tilelang" else "cpu"


def plan_rule(rule, algorithm: str, kind: str, rows=None, tile=None, dynamic_rows: bool = False,
              pieces: dict | None = None, dynamic_shape=None) -> RuleSpec:
    """The rule with its ladder and tile (defaults per backend kind); ``dynamic_rows``: the
    rows rule served by one CUDA kernel whose row count is a run-time value
    (``lcmac.schedules.cuda.rows``), a launch taking up to the ladder's largest bucket;
    ``pieces``: the any rule served by piece kernels of these ladders ({"M", "N", "K"});
    ``dynamic_shape`` (M, N, K): the any rule served by one CUDA kernel of run-time M, N and
    K, a launch taking up to that shape."""
    rule = parse_rule(rule)
    if pieces and rule.kind == "any":
        return RuleSpec(rule, algorithm, pieces=_ladders(pieces))
    if dynamic_shape and rule.kind == "any":
        if kind != "cuda":
            raise ArtifactError(f"dynamic_shape serves the ?x?x? rule on CUDA targets, not on a {kind} target")
        return RuleSpec(rule, algorithm, dynamic_shape=_max_shape(dynamic_shape))
    if dynamic_rows and (rule.kind != "rows" or kind != "cuda"):
        raise ArtifactError(f"dynamic_rows serves the ?xNxK rule on CUDA targets, not {rule} on "
                            f"a {kind} target")
    if rule.kind == "exact":
        return RuleSpec(rule, algorithm)
    if rule.kind == "rows":
        return RuleSpec(rule, algorithm, check_ladder(rows or BUILD_ROWS[kind]), dynamic_rows=dynamic_rows)
    tile = tuple(int(t) for t in (tile or ANY_TILE[kind]))
    if len(tile) != 2 or min(tile) < 1:
        raise ArtifactError(f"the any-shape tile must be two positive sizes (N, K); got {tile}")
    return RuleSpec(rule, algorithm, check_ladder(rows or ANY_ROWS[kind]), tile)


def build_bundle(algo: str, target=None, dtype="float32", rules=(None,), *, out_dir=".",
                 rows=None, tile=None, levels: int = 1, config=None, mcpu=None,
                 progress=None, dynamic_rows: bool = False, dynamic_shape: bool | None = None) -> Path:
    """Compile the bucket kernels of ``rules`` (each a rule text, shape or None = any shape)
    for ``algo`` into ``out_dir`` and write its index; returns the index path.
    ``rows``: the row ladder (default per backend, ``lcmac.spec.shape_rules.BUILD_ROWS`` /
    ``ANY_ROWS``); ``tile``: the any-shape rule's (T_N, T_K).  ``progress(text)`` hears of
    each kernel before it is compiled.  ``dynamic_rows``: the ?xNxK rules as one kernel of
    run-time M each (``plan_rule``); ``dynamic_shape``: on CUDA, the any rule as one kernel of
    run-time M, N and K where the config has that form and no row ladder or tile is given
    (None, the default, and True); False: copied N×K tiles.  A failed kernel raises and
    writes no index."""
    t = resolve_target(target)
    kind = backend_kind(t)
    # the any rule on piece kernels where they run (a CPU, float32/float64) and no row ladder
    # or tile asks for copied tiles
    pieces = shape = None
    if kind == "cpu" and rows is None and tile is None and normalize_dtype(dtype) in PIECE_DTYPES:
        pieces = piece_ladders(resolve_algorithm(algo, levels)[0].grid)
    # on CUDA: one kernel of run-time M, N and K where the config has that form
    if (dynamic_shape is not False and kind == "cuda" and rows is None and tile is None
            and _shape_form_why(algo, levels, t, dtype, config) is None):
        shape = ANY_MAX_SHAPE["cuda"]
    specs = [plan_rule(r, algo, kind, rows, tile, dynamic_rows and parse_rule(r).kind == "rows", pieces,
                       shape) for r in rules]
    return build_specs(specs, t, dtype, out_dir=out_dir, levels=levels, config=config, mcpu=mcpu,
                       progress=progress)


def build_specs(specs, target, dtype, *, out_dir=".", levels: int = 1, config=None, mcpu=None,
                progress=None, extra: dict | None = None) -> Path:
    """``build_bundle`` for planned rules, each with its own algorithm (``lcmac export``);
    ``extra``: fields added to the index (e.g. what each rule was decided from)."""
    t = resolve_target(target)
    wanted: list = []                        # (algorithm, kernel shape, run-time sizes, piece), each once
    for s in specs:
        for shp in s.shapes():
            if (s.algorithm, shp, _run_time(s), bool(s.pieces)) not in wanted:
                wanted.append((s.algorithm, shp, _run_time(s), bool(s.pieces)))
    out = Path(out_dir).resolve()
    if progress:
        for i, (a, shp, dyn, piece) in enumerate(wanted, 1):
            progress(f"[{i}/{len(wanted)}] {a} {t.name} {dtype} {'x'.join(map(str, shp))}"
                     + {"rows": " (run-time M)", "shape": " (run-time shape)", "": ""}[dyn]
                     + (" (piece)" if piece else ""))
    if isinstance(config, str):
        config = json.loads(config)
    jobs = [dict(algo=a, target=t, dtype=dtype, shape=shp, levels=levels,
                 config=dict(config or {}, dynamic_rows=True) if dyn == "rows" else
                 dict(config or {}, dynamic_shape=True) if dyn == "shape" else
                 _piece_config(config, dtype, t, a, levels, shp) if piece else config,
                 out_dir=str(out), mcpu=mcpu, **({"piece": True} if piece else {}))
            for a, shp, dyn, piece in wanted]
    results = build_many(jobs)
    for (a, shp, _, _), r in zip(wanted, results):
        if isinstance(r, BaseException):
            if isinstance(r, LcmacError):
                raise type(r)(f"building the {a} {'x'.join(map(str, shp))} kernel of the bundle: {r}")
            raise r
    built = {w: Manifest.read(p) for w, p in zip(wanted, results)}
    kernels = []
    for (_, _, _, piece), man in built.items():
        kernels.append({"name": man.name, "algorithm": {"name": man.algorithm["name"],
                                                         "hash": man.algorithm.get("hash")},
                        "shape": dict(man.shape), "config": man.config, "entry": man.entry,
                        "manifest": f"{man.name}.json", "library": man.library["file"],
                        "sha256": man.library["sha256"], "bytes": man.library["bytes"],
                        **({"piece": True} if piece else {})})
    rule_dicts = []
    for s in specs:
        mans = [built[(s.algorithm, shp, _run_time(s), bool(s.pieces))] for shp in s.shapes()]
        rule_dicts.append(RuleSpec(s.rule, mans[0].algorithm["name"], s.rows, s.tile,
                                   tuple(m.name for m in mans), s.dynamic_rows, s.pieces,
                                   s.dynamic_shape).to_dict())
    index = {"format": SHAPE_FORMAT if any(s.dynamic_shape for s in specs) else
             PIECES_FORMAT if any(s.pieces and s.pieces.get("run_time") for s in specs) else
             FIXED_PIECES_FORMAT if any(s.pieces for s in specs) else FORMAT,
             "lcmac_version": __version__,
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "target": {"name": t.name, "family": t.family, "backend": t.backend},
             "dtype": next(iter(built.values())).dtype, "rules": rule_dicts, "kernels": kernels,
             **(extra or {})}
    path = out / INDEX
    atomic_write_bytes(path, (json.dumps(index, indent=2) + "\n").encode())
    return path


def _shape_form_why(algo, levels: int, t, dtype: str, config) -> str | None:
    """Why the any rule of ``algo`` on CUDA target ``t`` has no kernel of run-time shape with
    ``config`` (``lcmac.schedules.cuda.rows.shape_why``; None: it has one); the rule is then
    served by copied tiles."""
    from lcmac.schedules.cuda.rows import shape_why
    from lcmac.spec.cuda.config import CudaConfig
    cfg = json.loads(config) if isinstance(config, str) else dict(config or {})
    alg, plain, _ = resolve_algorithm(algo, levels)
    dt = normalize_dtype(dtype)
    try:
        c = CudaConfig.from_dict(dict(cfg, dynamic_shape=True), dtype=dt, arch=t.arch, lcma=not plain)
    except LcmacError as e:
        return str(e)
    return shape_why(None if plain else alg, ANY_MAX_SHAPE["cuda"], dt, c, t.arch)


def _run_time(spec: RuleSpec) -> str:
    """Which sizes a rule's kernels take at run time: "rows", "shape" or "" (none)."""
    return "rows" if spec.dynamic_rows else "shape" if spec.dynamic_shape else ""


def _max_shape(shape) -> tuple:
    """The largest (M, N, K) of a run-time-shape rule, checked: three positive ints."""
    try:
        out = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or min(out) < 1:
        raise ArtifactError(f"dynamic_shape must be the largest [M, N, K] a launch takes, three "
                            f"positive sizes; got {shape!r}")
    return out


def _piece_config(config, dtype: str, target, algo: str, levels: int, shape):
    """A piece kernel's config: the caller's knobs, Combine H fused (the piece writes C only
    from its tile stores: cpu_lcma.generate), A and B packed per block in row bands (its
    rows a run-time count) where the target's default packs ahead (float64; float32 on
    16-register AVX2)."""
    alg = resolve_algorithm(algo, levels)[0]
    ahead = default_config(target, normalize_dtype(dtype), alg, shape=shape).bands == 0
    bands = {"bands": default_threads()} if ahead else {}
    return {**bands, **(config or {}), "fused": True}


def _ladders(pieces) -> dict:
    """Piece ladders checked: {"M", "N", "K"} ladders, "run_time" {"M", "K"} positive ints
    where given."""
    out = {dim: check_ladder(pieces[dim]) for dim in "MNK"}
    units = pieces.get("run_time")
    if units is not None:
        if not isinstance(units, dict) or set(units) != {"M", "K"} or not all(
                isinstance(u, int) and not isinstance(u, bool) and u >= 1 for u in units.values()):
            raise ValueError(f"pieces run_time must be {{M, K}} positive integers, not {units!r}")
        out["run_time"] = dict(units)
    return out


def is_bundle(path) -> bool:
    p = Path(path)
    return (p.is_dir() and (p / INDEX).is_file()) or p.name == INDEX


def read_bundle(path) -> Bundle:
    """The index of the bundle at ``path`` (its directory or bundle.json), checked: format,
    every rule's kernels listed, every kernel's manifest present.  Libraries are checked
    (size, sha256) when a kernel is loaded."""
    p = Path(path)
    index = p / INDEX if p.is_dir() else p
    try:
        d = json.loads(index.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"bundle index {index} cannot be read: {e}") from None
    if not isinstance(d, dict) or d.get("format") not in READ_FORMATS:
        got = d.get("format") if isinstance(d, dict) else None
        raise ArtifactError(f"{index} has format {got!r}; this lcmac reads "
                            f"{', '.join(READ_FORMATS[:-1])} and {READ_FORMATS[-1]}")
    try:
        kernels = {k["name"]: k for k in d["kernels"]}
        rules = []
        for r in d["rules"]:
            spec = RuleSpec(parse_rule(r["rule"]), r["algorithm"], tuple(r.get("rows") or ()),
                            tuple(r["tile"]) if r.get("tile") else None, tuple(r["kernels"]),
                            bool(r.get("dynamic_rows", False)),
                            _ladders(r["pieces"]) if r.get("pieces") else None,
                            _max_shape(r["dynamic_shape"]) if r.get("dynamic_shape") else None)
            if spec.dynamic_shape and (d["format"] != SHAPE_FORMAT or spec.rule.kind != "any"):
                raise ArtifactError(f"{index}: rule {spec.rule} has a run-time-shape kernel, which "
                                    f"format {d['format']} has not (only an any rule of {SHAPE_FORMAT})")
            if spec.pieces and bool(spec.pieces.get("run_time")) != (d["format"] == PIECES_FORMAT):
                raise ArtifactError(f"{index}: rule {spec.rule}'s pieces "
                                    + (f"have run-time extents, which format {d['format']} has not"
                                       if spec.pieces.get("run_time") else
                                       f"lack the run_time units {PIECES_FORMAT} gives them"))
            missing = [k for k in spec.kernels if k not in kernels]
            if missing or not spec.kernels:
                raise ArtifactError(f"{index}: rule {spec.rule} names kernels not in the bundle: {missing}")
            rules.append(spec)
        target, dtype = dict(d["target"]), str(d["dtype"])
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"bundle index {index} is malformed ({type(e).__name__}: {e})") from None
    b = Bundle(index.parent, target, dtype, rules, kernels, str(d.get("lcmac_version", "")))
    for name in kernels:
        if not b.manifest_path(name).is_file():
            raise ArtifactError(f"bundle {b.path}: the manifest of kernel {name} is missing")
    return b
