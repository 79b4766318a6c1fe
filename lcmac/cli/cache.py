"""``lcmac cache``: where the kernel caches are, what they hold, and emptying them: the LCMA
kernels (``lcmac.artifact.cache``) and the bit kernels (``lcmac.bits.cache``), both kernel
stores (``lcmac.artifact.store``; docs/cache.md), and the computed results kept beside them
(``lcmac.core.result_cache``: the accuracy simulations)."""
from __future__ import annotations

import argparse
import os
import sys

from lcmac.artifact import cache as kcache
from lcmac.bits import cache as bit_kernels
from lcmac.cli.output import dump_json, size_text, table
from lcmac.core.result_cache import result_caches


def _bit_kernels(args) -> tuple[list[dict], str]:
    """The bit kernels (``lcmac.bits.cache``) and their bytes as text; none with ``--dir``,
    which names an LCMA kernel cache only."""
    bits = [] if args.dir else bit_kernels.cached_kernels()
    return bits, size_text(sum(b["bytes"] for b in bits))


def _results(args) -> list[dict]:
    """The result caches holding entries (``lcmac.core.result_cache``); none with ``--dir``."""
    return [] if args.dir else [r for r in (c.info() for c in result_caches()) if r["entries"]]


def _results_text(results: list[dict]) -> list[str]:
    return [f"{r['entries']} {r['name']} results ({size_text(r['bytes'])}) in {r['dir']}"
            for r in results]


def cmd_cache_info(args) -> int:
    inf = kcache.info(args.dir)
    if args.json:
        dump_json("cache-info", dict(inf, result_caches=[] if args.dir else
                                     [c.info() for c in result_caches()]))
        return 0
    state = "" if inf["exists"] else "  (not created yet)"
    print(f"kernel cache  {inf['dir']}{state}")
    print(f"entries       {inf['entries']}")
    print(f"size          {size_text(inf['bytes'])}")
    print("set by        " + ("--dir" if args.dir else "LCMAC_CACHE_DIR (its kernels/ subdirectory)"
                              if os.environ.get("LCMAC_CACHE_DIR") else
                              "default (LCMAC_CACHE_DIR sets it)"))
    if not args.dir:
        bits, size = _bit_kernels(args)
        print(f"bit kernels   {len(bits)}, {size} in {bit_kernels.cache_dir()}")
        for c in result_caches():
            r = c.info()
            print(f"results       {r['name']}: {r['entries']}, {size_text(r['bytes'])} in "
                  f"{r['dir'] or '(none: LCMAC_CACHE_DIR=off)'}")
    return 0


def cmd_cache_list(args) -> int:
    es = kcache.entries(args.dir)
    bits, _ = _bit_kernels(args)
    if args.json:
        dump_json("cache-list", {"dir": str(kcache.cache_dir(args.dir)), "entries": [
            {"key": e.key, "algorithm": e.algorithm, "target": e.target, "dtype": e.dtype,
             "shape_rule": e.shape_rule, "config": e.config, "lcmac_version": e.lcmac_version,
             "created": e.created, "bytes": e.bytes, "ok": e.ok,
             "manifest": str(e.manifest) if e.manifest else None} for e in es],
            "bit_kernels_dir": None if args.dir else str(bit_kernels.cache_dir()),
            "bit_kernels": bits, "result_caches": _results(args)})
        return 0
    if not es:
        print(f"the kernel cache {kcache.cache_dir(args.dir)} holds no kernels")
    else:
        rows = [[e.algorithm, e.target, e.dtype, e.shape_rule, size_text(e.bytes), e.created.replace("T", " ")[:16],
                 e.key[:12] + ("" if e.ok else "  (damaged: rebuilt on next use)")] for e in es]
        print(table(rows, ["algorithm", "target", "dtype", "shape rule", "size", "created (UTC)", "key"]))
    if bits:
        print(f"\nbit kernels ({bit_kernels.cache_dir()}; lcmac.bits):")
        rows = [[b["kind"], str(b["for"]), size_text(b["bytes"]),
                 b["key"][:17] + ("" if b["ok"] else "  (damaged: rebuilt on next use)")] for b in bits]
        print(table(rows, ["kind", "for", "size", "key"]))
    for line in _results_text(_results(args)):
        print(f"\nresults: {line}")
    return 0


def cmd_cache_clear(args) -> int:
    inf = kcache.info(args.dir)
    bits, bits_size = _bit_kernels(args)
    results = _results(args)
    kernels_empty = not inf["exists"] or (inf["entries"] == 0 and inf["bytes"] == 0)
    if kernels_empty and not bits and not results:
        print(f"the kernel cache {inf['dir']} is empty")
        return 0
    what = f"{inf['entries']} kernels ({size_text(inf['bytes'])}) from {inf['dir']}"
    if bits:
        what += f" and {len(bits)} bit kernels ({bits_size}) from {bit_kernels.cache_dir()}"
    for line in _results_text(results):
        what += f" and {line.replace(' in ', ' from ', 1)}"
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"lcmac cache clear: this would remove {what}; pass --yes to do it",
                  file=sys.stderr)
            return 2
        if input(f"remove {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    if not kernels_empty:
        r = kcache.clear(args.dir)
        print(f"removed {r['entries']} kernels ({size_text(r['bytes'])}) from {inf['dir']}")
    if bits:
        b = bit_kernels.clear_kernels()
        print(f"removed {b['entries']} bit kernels ({size_text(b['bytes'])}) from "
              f"{bit_kernels.cache_dir()}")
    for c in [] if args.dir else result_caches():
        r = c.clear()
        if r["entries"]:
            print(f"removed {r['entries']} {c.name} results ({size_text(r['bytes'])}) from "
                  f"{c.directory()}")
    return 0


def add_cache_parser(sub) -> None:
    s = sub.add_parser("cache", help="the kernel cache: where it is, what it holds, clear it",
                       description="Kernels compiled on first use (lcmac.auto(build=True), "
                                   "lcmac.artifact.cache.cached_build) live in the kernel cache: "
                                   "$LCMAC_CACHE_DIR/kernels, else $XDG_CACHE_HOME/lcmac/kernels, "
                                   "else ~/.cache/lcmac/kernels; one directory per key (algorithm, "
                                   "target, dtype, shape rule, config, lcmac and compiler "
                                   "versions). See docs/cache.md.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=None, metavar="DIR",
                        help="the cache directory itself (default: as above)")
    ops = s.add_subparsers(dest="cache_command", metavar="ACTION")
    i = ops.add_parser("info", parents=[common], help="where the cache is, its entries and bytes",
                       description="The cache directory, its number of entries and its size on "
                                   "disk.")
    i.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-cache-info/1)")
    i.set_defaults(func=cmd_cache_info)
    ls = ops.add_parser("list", parents=[common], help="the cached kernels, oldest first",
                        description="One row per cached kernel: algorithm, target, dtype, shape "
                                    "rule (exact:MxNxK = that one shape), size, date built and "
                                    "the key's first digits.")
    ls.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-cache-list/1)")
    ls.set_defaults(func=cmd_cache_list)
    c = ops.add_parser("clear", parents=[common], help="remove every cached kernel and result",
                       description="Remove every cached kernel (compiled again on next use) and, "
                                   "without --dir, the bit kernels and the results kept beside "
                                   "them (the accuracy simulations: computed again). A build in "
                                   "progress in another process completes. Asks first unless --yes.")
    c.add_argument("--yes", "-y", action="store_true", help="do not ask (needed when not on a terminal)")
    c.set_defaults(func=cmd_cache_clear)
    s.set_defaults(func=lambda args: (s.print_help(), 2)[1])
