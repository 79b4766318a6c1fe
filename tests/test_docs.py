"""The documentation holds together: README length, links, the generated results table, the
results index (every result file listed and cited by a page), no dated measurement diary in
docs/, paths that exist, and no file that speaks of how the project was developed.  No builds:
fast."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "bench" / "results"
EXPERIMENTS = ROOT / "bench" / "experiments"
TUNING_LOGS_README = ROOT / "lcmac" / "data" / "tuning_logs" / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# the pages that may cite a result file: the user guide, the experiments, the examples
CITING = [README, *DOCS, *sorted(EXPERIMENTS.glob("*.md")),
          *sorted((ROOT / "examples").rglob("*.md")), TUNING_LOGS_README]
# the pages whose relative links are checked
PAGES = [*CITING, RESULTS / "README.md"]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")     # a code span may wrap, not cross a paragraph
_LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids of a markdown page: lower case, punctuation dropped, spaces to
    hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for h in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)          # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _tracked_files() -> list[Path]:
    """Files git tracks or would track (untracked but not ignored), that exist."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    files = [ROOT / p for p in out.decode().split("\0") if p]
    return [p for p in files if p.is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None                                          # binary (plots)
    return data.decode("utf-8", errors="replace")


def test_readme_is_at_most_300_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"README.md has {n} lines; move detail into docs/ (at most 300)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page):
    if not page.is_file():
        pytest.skip(f"{page.relative_to(ROOT)} does not exist")
    bad = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):         # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no heading with id #{anchor})")
    assert not bad, f"broken links in {page.relative_to(ROOT)}:\n  " + "\n  ".join(bad)


def test_readme_results_table_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_table.py"), "--check",
                        str(README)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr or r.stdout


def test_results_index_lists_every_result_file():
    index = json.loads((RESULTS / "index.json").read_text(encoding="utf-8"))
    entries = {e["file"]: e for e in index["entries"]}
    on_disk = {p.name for p in RESULTS.iterdir() if p.name not in ("index.json", "README.md")}
    assert set(entries) == on_disk, (f"not in index.json: {sorted(on_disk - set(entries))}; "
                                     f"listed but missing: {sorted(set(entries) - on_disk)}")
    for name, e in entries.items():
        missing = [k for k in ("what", "device", "date", "command") if not e.get(k)]
        assert not missing, f"{name}: index entry lacks {missing}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", e["date"]), f"{name}: date {e['date']!r}"


# Wording about how the project was developed: the word "session" followed by a number, or
# preceded by this/earlier/previous/next/same/...  pytest's own vocabulary (scope="session",
# request.session, "once per session") does not match.
HISTORY = re.compile(r"\bsessions?[ _-]?\d+|\b(?:this|that|earlier|previous|next|last|same|"
                     r"an earlier|a later|later|each|every)[ ]sessions?\b", re.I)


def test_no_file_speaks_of_development_sessions():
    offenders = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            m = HISTORY.search(line)
            if m:
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)!r}")
    by_file: dict[str, list[str]] = {}
    for o in offenders:
        by_file.setdefault(o.split(":", 1)[0], []).append(o)
    lines = []
    for f, hits in sorted(by_file.items()):
        lines += hits[:5] + ([f"{f}: ... {len(hits) - 5} more lines"] if len(hits) > 5 else [])
    assert not offenders, (
        f"{len(offenders)} lines in {len(by_file)} files speak of development sessions; say "
        "what is true now, with dates where a date matters. Files: "
        + ", ".join(f"{f} ({len(h)})" for f, h in sorted(by_file.items())) + "\n  "
        + "\n  ".join(lines))


def test_no_file_refers_outside_the_repository():
    shared = "sha" + "red"                    # spelled apart so this file does not match
    outside = re.compile(r"\.\./" + shared + r"\b|/work/" + shared + r"\b|(?<![\w/.])"
                         + "DES" + r"IGN\.md\b")      # the design notes are docs/design.md
    offenders = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if outside.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{i}")
    assert not offenders, "files refer to a directory outside the repository:\n  " + \
        "\n  ".join(offenders)


# a path into the repository's own folders, as written in prose, comments and docstrings
_REPO_PATH = re.compile(r"(?<![\w/.])(?:bench/results|bench|scripts|research|docs|tuning_logs|"
                        r"lcmac/data/tuning_logs|examples)/[\w.\-^/]*\w")


# a git revision before a path: ``COMMIT:PATH`` names the file as it was at that commit
_AT_COMMIT = re.compile(r"\b[0-9a-f]{7,40}:$")


def test_paths_mentioned_in_sources_and_docs_exist():
    """A file named in a page, a docstring or a comment exists (files move; references must
    follow).  Recorded commands inside bench/results are history and are not checked; names
    with a pattern (``*``, ``{a,b}``, ``<gpu>``), output paths (``--out X``, ``-o X``) and
    paths at a commit (``c2ef40f:research/x.py``, what ``git show`` takes: history) are skipped;
    a C example's binary counts when its source exists."""
    bad = []
    for path in _tracked_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("bench/results/") or path.suffix not in (".py", ".md", ".toml", ".c",
                                                                  ".h", ".cu", ".txt", ""):
            continue
        text = _text(path)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for m in _REPO_PATH.finditer(line):
                name, after = m.group(0), line[m.end():m.end() + 2]
                before = line[:m.start()].rstrip()
                if any(c in after for c in "*{<$") or before.endswith(("--out", "-o", "--out=")) \
                        or _AT_COMMIT.search(line[:m.start()]) \
                        or (ROOT / name).exists() or (ROOT / (name + ".c")).exists():
                    continue                   # a pattern, an output path, history, a binary
                bad.append(f"{rel}:{i}: {name}")
    assert not bad, "files name paths that do not exist (moved or removed?):\n  " + "\n  ".join(bad)


def _link_targets(page: Path) -> set[Path]:
    """The files a page's relative links point to (anchors dropped)."""
    out = set()
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path = target.partition("#")[0]
        if path:
            out.add((page.parent / path).resolve())
    return out


def test_every_result_file_is_cited():
    """bench/results holds only what a page cites: the user guide, the README, an experiments
    page, an example or the tuning logs' README links every file (the index lists them all,
    test_results_index_lists_every_result_file)."""
    cited = set()
    for page in CITING:
        if page.is_file():
            cited |= _link_targets(page)
    on_disk = [p for p in sorted(RESULTS.iterdir())
               if p.name not in ("index.json", "README.md") and p.is_file()]
    uncited = [p.name for p in on_disk if p.resolve() not in cited]
    assert not uncited, (f"{len(uncited)} files in bench/results are cited by no page (docs/, "
                         "README.md, bench/experiments/, examples/): cite each from the page "
                         "that describes its run, or git rm it:\n  " + "\n  ".join(uncited))


_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# headings of a lab notebook: a date, or a section that records runs rather than describes use
_DIARY_HEADING = re.compile(r"^(?:experiments?|measured|measurements|tested|what was "
                            r"(?:measured|tried))\b|\bexperiments\b", re.I)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_hold_no_dated_diary(page):
    """docs/ is the user guide and the design: no heading names a date or opens a record of
    runs ("Measured", "Tested", "Experiments"), and no paragraph carries a date (dates belong
    in bench/results/index.json and bench/experiments/, which say when each run was made; a
    page links the result file instead)."""
    text = page.read_text(encoding="utf-8")
    bad = []
    for h in _HEADING.findall(_FENCE.sub("", text)):
        if _DATE.search(h) or _DIARY_HEADING.search(h.strip("*_` ")):
            bad.append(f"heading {h!r}")
    prose = _LINK.sub("[link]", _prose(text))                  # a linked file's name is no date
    for para in re.split(r"\n\s*\n", prose):
        m = _DATE.search(para)
        if m:
            bad.append(f"a paragraph dated {m.group(0)}: {' '.join(para.split())[:100]!r}")
    assert not bad, (f"{page.relative_to(ROOT)} reads as a measurement diary; move the run to "
                     "bench/experiments/ and cite its file:\n  " + "\n  ".join(bad))


# a path into lcmac/ as the docs write it (lcmac/runtime/include/lcmac.h, lcmac/spec/cuda/)
_LCMAC_PATH = re.compile(r"(?<![\w/.])lcmac/[\w.\-/]*\w")
# a dotted name under lcmac (lcmac.costmodel.accuracy.error_ratio, lcmac.nn.Linear)
_LCMAC_NAME = re.compile(r"(?<![\w.])lcmac(?:\.[A-Za-z_]\w*)+")
# public module paths that lcmac/__init__.py maps to the modules holding them
_ALIASES = {"lcmac.nn": "lcmac.torch.nn", "lcmac.ops": "lcmac.api.matmul",
            "lcmac.distributed": "lcmac.parallel.distributed"}
_NOT_NAMES = {"lcmac.h"}                                       # the C header's file name


def _module_source(dotted: str) -> str | None:
    """The source of module ``dotted`` (a package's __init__), or None if there is none."""
    base = ROOT / Path(*dotted.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f.read_text(encoding="utf-8")
    return None


def _name_problem(name: str) -> str | None:
    """Why ``lcmac.a.b.c`` names nothing: its longest module prefix must exist, and the next
    part must be a word of that module's source (a def, a class, a constant, an import)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        mod = ".".join(parts[:n])
        src = _module_source(_ALIASES.get(mod, mod).replace(".", "/").replace("/", "."))
        if src is not None:
            if n == len(parts) or re.search(rf"\b{re.escape(parts[n])}\b", src):
                return None
            return f"{mod} has no {parts[n]!r}"
    return "no such module"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_lcmac_paths_and_names_in_docs_exist(page):
    """Every lcmac/... path a page names exists, and every lcmac.x.y module (with the first
    name after it) does: modules move, and the pages must follow."""
    text = page.read_text(encoding="utf-8")
    bad = [f"{p} (no such file)" for p in sorted(set(_LCMAC_PATH.findall(text)))
           if not (ROOT / p).exists()]
    for name in sorted(set(_LCMAC_NAME.findall(text)) - _NOT_NAMES):
        why = _name_problem(name)
        if why:
            bad.append(f"{name} ({why})")
    assert not bad, f"{page.relative_to(ROOT)} names what does not exist:\n  " + "\n  ".join(bad)
