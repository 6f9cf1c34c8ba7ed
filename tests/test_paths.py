"""Paths that exist: every `specviz/…`, `docs/…`, `experiments/…`, `assets/…` or `tests/…` path named in the code
(specviz/, app.py, tests/, experiments/probes/), the docs (README.md, docs/*.md, experiments/*.md) and the Makefile,
and every relative link in the docs (and its #heading), names a file or folder of the repository. Paths under out/
(outputs: training folders, builds, benches) and ../shared/ (data outside the repository) start elsewhere and are not
read. No model."""
from __future__ import annotations

import glob
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("specviz/**/*.py", "specviz/**/*.c", "app.py", "tests/*.py", "experiments/probes/*.py", "README.md",
           "docs/*.md", "experiments/*.md", "assets/drafters/*/README.md", "Makefile")
DOCS = ("README.md", "docs/*.md", "experiments/*.md", "assets/drafters/*/README.md")
SELF = "tests/test_paths.py"  # its own examples name missing paths on purpose

# a path starts at one of the five folders, not inside a longer path, a URL or a word (`out/specviz/x`, `a.tests/`)
PATH = re.compile(r"(?<![\w./-])((?:specviz|docs|experiments|assets|tests)/[\w./*<>{}$(),%:@+-]*)")
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)")  # a Markdown link: its file (none: this one) and #anchor
# the parts of a named path that stand for a family of files, each read as a glob:
PLACEHOLDERS = re.compile(
    r"<[a-z]+>"              # experiments/results/ar_step_profile-<cpu>.txt: one file per CPU class
    r"|\{[a-z_]+\}"          # an f-string field: f"experiments/results/llama_cpp_yardstick-{tag}.txt"
    r"|\$\$\w+|\$\(\w+\)"    # a shell or make variable in the Makefile: assets/drafters/smollm2-135m-$$k
    r"|%0\d+g"               # seq -f 'assets/distill/prompts/chunk-%05g.jsonl.gz'
    r"|\b(?:NAME|NNNNN)\b")  # the docs' spelled-out placeholders: experiments/probes/NAME.py, chunk-NNNNN.jsonl.gz
BRACES = re.compile(r"\{([\w.-]+(?:,[\w.-]+)+)\}")  # brace expansion: assets/drafters/smollm2-135m-{eagle,medusa}/
# named on purpose though absent: a test that asserts the folder stays gone
GONE = {("tests/test_experiments.py", "assets/bench"), ("tests/test_experiments.py", "assets/bench/")}


def source_files(patterns=SOURCES) -> list[Path]:
    return sorted({p for pattern in patterns for p in ROOT.glob(pattern)
                   if p.is_file() and p.relative_to(ROOT).as_posix() != SELF})


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) for every path the text names. A `git show REV:PATH` argument names a file at another
    revision, so a path right after a colon is not read; `tests/x.py::test_y` keeps its file."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            if line[max(0, m.start() - 1):m.start()] == ":":
                continue
            found.append((number, m.group(1).split("::")[0].rstrip(".,:;)")))
    return found


def expansions(path: str) -> list[str]:
    """The path as globs: placeholders become *, each {a,b} alternative its own path."""
    path = PLACEHOLDERS.sub("*", path)
    m = BRACES.search(path)
    if not m:
        return [path]
    return list(itertools.chain.from_iterable(
        expansions(path[:m.start()] + alt + path[m.end():]) for alt in m.group(1).split(",")))


def exists(path: str, base: Path = ROOT) -> bool:
    return all(glob.glob(str(base / p), recursive=True) for p in expansions(path))


def missing_paths() -> list[str]:
    missing = []
    for f in source_files():
        rel = f.relative_to(ROOT).as_posix()
        for number, path in named_paths(f.read_text(encoding="utf-8")):
            if (rel, path) not in GONE and not exists(path):
                missing.append(f"{rel}:{number}: {path}")
    return missing


def anchors(markdown: Path) -> set[str]:
    """The #anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        in_code ^= line.startswith("```")
        m = None if in_code else re.match(r"#{1,6} (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def missing_links() -> list[str]:
    missing = []
    for f in source_files(DOCS):
        for number, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for target, anchor in LINK.findall(line):
                if "://" in target or target.startswith("mailto:"):
                    continue
                where = f"{f.relative_to(ROOT).as_posix()}:{number}: {target}"
                if target and not exists(target, f.parent):
                    missing.append(where)
                elif anchor:  # a heading of a Markdown page (this one when the link names no file)
                    page = f.parent / target if target else f
                    if page.suffix == ".md" and anchor not in anchors(page):
                        missing.append(f"{where}#{anchor}")
    return missing


def test_named_paths_exist():
    missing = missing_paths()
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


def test_doc_links_exist():
    missing = missing_links()
    assert not missing, "links to files or headings that do not exist:\n" + "\n".join(missing)


def test_the_reader_finds_what_it_should():
    """The scanner itself: paths in prose, code strings and commands, placeholders and globs read as families of
    files, a stale path reported, and what is not a repository path (a URL, a longer path, a git revision) left out."""
    text = ("see `docs/performance.md` and specviz/models/fused.py, then (tests/test_cli.py::test_x).\n"
            "out/specviz/x https://example.com/docs/x.md git show abc:specviz/kernels.py\n"
            "experiments/results/ar_step_profile-<cpu>.txt assets/drafters/smollm2-135m-{eagle,draft}/README.md\n"
            "specviz/no_such_module.py\n")
    paths = [p for _, p in named_paths(text)]
    assert paths == ["docs/performance.md", "specviz/models/fused.py", "tests/test_cli.py",
                     "experiments/results/ar_step_profile-<cpu>.txt",
                     "assets/drafters/smollm2-135m-{eagle,draft}/README.md", "specviz/no_such_module.py"]
    assert [exists(p) for p in paths] == [True] * 5 + [False]
    assert expansions("assets/drafters/smollm2-135m-{eagle,draft}/x") == ["assets/drafters/smollm2-135m-eagle/x",
                                                                         "assets/drafters/smollm2-135m-draft/x"]
    assert not exists("assets/drafters/smollm2-135m-{eagle,nope}/README.md")  # every alternative must exist
