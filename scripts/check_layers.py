"""Check lcmac's structure: layers that point down, no import circles, backends imported only
where they may be, and modules and functions of a readable size.

    python scripts/check_layers.py            # exit 1 and a list of what is wrong
    python scripts/check_layers.py --graph    # also print the imports between layers

Every ``import`` counts, at the top of a module or inside a function: a function-level import
still ties the modules together, it only hides the tie from a reader.

Each folder of ``lcmac/`` is one layer; lowest first (a module may import its own layer and
any lower one, never a higher one):

    core       errors, dtypes, shapes, version, the cache directory
    ir         algorithms, catalogue, verification, CSE
    spec       what can be built: the target table, host facts, template configs, support
               checks, schedule families, hardware profiles, shape rules
    costmodel  analytic time and accuracy models
    schedules  the per-target kernel templates
    targets    the compile workers and toolchains
    artifact   build, manifest, kernel cache, tuning log
    runtime    loaders (no compiler)
    bits       bit-matrix products (GF(2), Boolean)
    tune       the tuner
    policy     the decision
    api        lcmac.matmul (and its co-execution), lcmac.auto, lcmac.bmm, export
    parallel   products over the ranks of a process group (lcmac.distributed), on lcmac.matmul
    torch      the op registration, lcmac.nn, graph stages
    cli        the command line
    lcmac      the package itself (``__init__``, ``__main__``)

A module in no layer is an error.  Import circles are found among modules; the edge from a
package's ``__init__`` to a module inside that package (a re-export) is not part of one.
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: the layers, lowest first: each a folder of lcmac/, the package's own modules last
LAYERS = ("core", "ir", "spec", "costmodel", "schedules", "targets", "artifact", "runtime",
          "bits", "tune", "policy", "api", "parallel", "torch", "cli", "lcmac")
#: the modules of the top layer, the package itself
PACKAGE_MODULES = ("lcmac", "lcmac.__main__")

#: third-party compilers: only these modules may import them (apache-tvm and TileLang cannot
#: share a process, so each lives behind its worker)
BACKENDS = ("tvm", "tilelang")
BACKEND_MODULES = ("lcmac.targets.tvm_worker", "lcmac.targets.tvm_plugins",
                   "lcmac.targets.tilelang_worker", "lcmac.schedules.te_lcma")
#: the CUDA kernel templates: every module of lcmac.schedules.cuda but its __init__
CUDA_TEMPLATE_PACKAGE = "lcmac.schedules.cuda"
NOT_TEMPLATES = ("lcmac.schedules.cuda",)

#: kernel templates that are not TileLang prim_funcs: the CPU template that writes TVMScript
#: and the vector-length-agnostic TE lowering
CPU_KERNEL_TEMPLATES = {("lcmac.schedules.cpu_lcma", "generate"), ("lcmac.schedules.te_lcma", "lcma_prim_func")}

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    #: (layer, higher layer) → the imports that point up (each one is also a problem)
    arrows: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: (layer, lower layer) → how many imports point down
    downward: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, msg: str) -> None:
        self.problems.append(msg)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The layer of a module of the package: the folder right below ``lcmac/`` that holds
    it, or ``lcmac`` for the package's own modules; None for any other module."""
    if module in PACKAGE_MODULES:
        return "lcmac"
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "lcmac" and parts[1] in LAYERS[:-1]:
        return parts[1]
    return None


def is_reexport(module: str, is_package: bool, imported: str) -> bool:
    """An import by package ``module``'s ``__init__`` of a module inside that package."""
    return is_package and imported.startswith(module + ".")


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def imports_of(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the tree, at any depth.  ``from p import
    x`` names the submodule p.x when that is a module, else p."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            for a in node.names:
                sub = f"{target}.{a.name}" if target else a.name
                out.append((sub if sub in known else target, node.lineno))
    return list(dict.fromkeys(out))


def _is_kernel_template(fn: ast.AST) -> bool:
    """A function whose body builds a TileLang kernel (``@T.prim_func`` inside)."""
    for node in ast.walk(fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not fn:
            for d in node.decorator_list:
                if isinstance(d, ast.Attribute) and d.attr == "prim_func":
                    return True
    return False


def check_sizes(tree: ast.AST, text: str, rel: str, report: Report, functions: bool = True,
                module: str = "") -> None:
    n = text.count("\n") + (0 if text.endswith("\n") else 1)
    if n > MAX_MODULE_LINES:
        report.add(f"{rel}: {n} lines (limit {MAX_MODULE_LINES})")
    if not functions:
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            template = _is_kernel_template(node) or (module, node.name) in CPU_KERNEL_TEMPLATES
            if length > MAX_FUNCTION_LINES and not template:
                report.add(f"{rel}:{node.lineno}: function {node.name} is {length} lines "
                           f"(limit {MAX_FUNCTION_LINES}, kernel templates excepted)")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    out.append(sorted(comp))
    return out


def check(package_dir: Path, extra_dirs: tuple[Path, ...] = ()) -> Report:
    """Check the package at ``package_dir`` (its parent is the import root); ``extra_dirs``
    (scripts/, tests/) are checked for module size only."""
    root = package_dir.parent
    report = Report()
    files = sorted(package_dir.rglob("*.py"))
    known = {module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {m: set() for m in known}
    for path in files:
        mod = module_name(path, root)
        text = path.read_text()
        tree = ast.parse(text, str(path))
        rel = str(path.relative_to(root))
        check_sizes(tree, text, rel, report, module=mod)
        src_layer = layer_of(mod)
        if src_layer is None:
            report.add(f"{rel}: module {mod} is in no layer (its folder must be one of LAYERS)")
            continue
        is_package = path.name == "__init__.py"
        for dst, line in imports_of(tree, mod, is_package, known):
            top = dst.split(".")[0]
            if top in BACKENDS:
                allowed = mod in BACKEND_MODULES or (mod.startswith(CUDA_TEMPLATE_PACKAGE + ".")
                                                     and mod not in NOT_TEMPLATES)
                if not allowed:
                    report.add(f"{rel}:{line}: imports the {top} backend (only the workers and "
                               f"the schedule templates may)")
                continue
            if dst not in known:
                continue
            if dst != mod and not is_reexport(mod, is_package, dst):
                graph[mod].add(dst)
            dst_layer = layer_of(dst)
            if dst_layer is None or dst_layer == src_layer:
                continue
            if LAYERS.index(dst_layer) < LAYERS.index(src_layer):
                key = (src_layer, dst_layer)
                report.downward[key] = report.downward.get(key, 0) + 1
                continue
            report.arrows.setdefault((src_layer, dst_layer), []).append(f"{rel}:{line} → {dst}")
            report.add(f"{rel}:{line}: {src_layer} imports {dst} ({dst_layer}), a higher layer")
    for comp in _cycles(graph):
        report.add("import circle: " + " ↔ ".join(comp))
    for d in extra_dirs:
        for path in sorted(d.rglob("*.py")):
            text = path.read_text()
            check_sizes(ast.parse(text, str(path)), text, str(path.relative_to(d.parent)), report,
                        functions=False)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="store_true", help="print the imports between layers")
    a = ap.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    report = check(repo / "lcmac", (repo / "scripts", repo / "tests"))
    if a.graph:
        for (src, dst), n in sorted(report.downward.items(),
                                    key=lambda kv: (LAYERS.index(kv[0][0]), LAYERS.index(kv[0][1]))):
            print(f"{src} → {dst}: {n} imports")
    for (src, dst), sites in sorted(report.arrows.items()):
        print(f"upward arrow {src} → {dst} ({len(sites)} imports):")
        for site in sites:
            print(f"    {site}")
    for p in report.problems:
        print(p)
    print(f"check_layers: {len(report.problems)} problems, {len(report.arrows)} upward arrows")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
