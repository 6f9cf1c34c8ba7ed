"""The code's shape, checked from its source (no model, nothing imported): imports point one way (no cycle between
the modules of specviz/), nothing is re-exported behind `noqa: F401`, and no module reaches for another module's
underscored name. Each test names every offence it finds, with its file and line."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specviz"


def module_name(path: Path) -> str:
    """specviz/engines/tree.py -> specviz.engines.tree; specviz/engines/__init__.py -> specviz.engines."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> dict[str, Path]:
    """Every module of specviz/ by its dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def checked_files() -> list[Path]:
    """The product's source: specviz/ and app.py."""
    return [*package_files().values(), ROOT / "app.py"]


def resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a `from ... import` statement reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module, line) for every specviz module `path` imports anywhere in its body: at the top, inside functions,
    under `if TYPE_CHECKING:` alike. `from package import name` counts as importing package.name when that is a
    module, else as importing the package."""
    name = module_name(path) if path.is_relative_to(PACKAGE) else path.stem
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            source = resolve(node, name, path.name == "__init__.py")
            for a in node.names:
                if f"{source}.{a.name}" in known:
                    out.append((f"{source}.{a.name}", node.lineno))
                elif source in known:
                    out.append((source, node.lineno))
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the first line that does}."""
    files = package_files()
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        edges: dict[str, int] = {}
        for target, line in imports(path, set(files)):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a closed path of imports, its first module repeated at the end) through each strongly connected
    component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [closed_path(graph, set(c), c[0]) for c in components]


def closed_path(graph: dict[str, dict[str, int]], members: set[str], start: str) -> list[str]:
    """The shortest path of imports from `start` back to itself inside one component (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def describe(path: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {path[-1]}"


def test_no_import_cycle():
    graph = import_graph()
    found = [describe(c, graph) for c in cycles(graph)]
    assert not found, "import cycles in specviz/ (lazy and TYPE_CHECKING imports count):\n" + "\n".join(found)


def test_the_cycle_finder_finds_one():
    """The walk sees a planted cycle, so an empty answer above means none."""
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


REEXPORT = re.compile(r"noqa:[^#]*\bF401\b")


def test_no_reexport_behind_noqa():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in checked_files()
             for i, line in enumerate(p.read_text().splitlines(), 1) if REEXPORT.search(line)]
    assert not found, ("unused imports kept with noqa: F401 (re-exports): import from the defining module instead:\n"
                       + "\n".join(found))


def test_the_noqa_pattern_sees_every_spelling():
    for line in ("import x  # noqa: F401", "import x  # noqa:F401", "import x  # noqa: E402, F401  (why)"):
        assert REEXPORT.search(line), line
    assert not REEXPORT.search("import x  # noqa: E402")


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(source: str, own: str, is_package: bool, label: str, known: set[str]) -> list[str]:
    """Every `from specviz.x import _name` and `specviz.x._name` (through any alias of a specviz module) in `source`,
    the text of module `own`, that names another module's underscored name."""
    tree = ast.parse(source, label)
    aliases: dict[str, str] = {}  # local name -> the specviz module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            module = resolve(node, own, is_package)
            if module.split(".")[0] != "specviz":
                continue
            for a in node.names:
                if f"{module}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{module}.{a.name}"
                elif private(a.name) and module != own:
                    found.append(f"{label}:{node.lineno}: from {module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                module = ".".join([aliases[value.id], *reversed(chain)])
                if module in known and module != own:
                    found.append(f"{label}:{node.lineno}: {module}.{node.attr}")
    return found


def test_no_private_name_across_modules():
    known = set(package_files())
    found = [f for p in checked_files()
             for f in private_reaches(p.read_text(), module_name(p) if p.is_relative_to(PACKAGE) else p.stem,
                                      p.name == "__init__.py", str(p.relative_to(ROOT)), known)]
    assert not found, ("underscored names used outside their module: make the helper public (or move it to its "
                       "users):\n" + "\n".join(found))


def test_the_private_name_finder_finds_each_form():
    known = {"specviz", "specviz.config", "specviz.check", "specviz.check.report", "specviz.engines",
             "specviz.engines.tree"}
    planted = """
from specviz.config import _number, number
from specviz.check import report
import specviz.config as C
from . import tree
from .tree import _grafted


def f():
    import specviz.check.report
    return report._table, C._number, specviz.check.report._f, tree._x, report.__name__, _own()
"""
    found = private_reaches(planted, "specviz.engines.eagle", False, "x.py", known)
    assert found == ["x.py:2: from specviz.config import _number", "x.py:6: from specviz.engines.tree import _grafted",
                     "x.py:11: specviz.check.report._table", "x.py:11: specviz.config._number",
                     "x.py:11: specviz.check.report._f", "x.py:11: specviz.engines.tree._x"], found
    assert private_reaches("from specviz.config import _number\nx = _number", "specviz.config", False, "config.py",
                           known) == []  # its own


MAX_FUNCTION_LINES = 80  # a function fits on a screen (issue 42)
MAX_APP_LINES = 120      # app.py composes the tabs and launches


def long_functions(source: str, name: str) -> list[str]:
    """'name:line function (n lines)' for each function of `source` longer than MAX_FUNCTION_LINES."""
    return [f"{name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def test_functions_fit_on_a_screen_and_app_py_only_composes():
    files = sorted((ROOT / "specviz").rglob("*.py")) + [ROOT / "app.py"]
    long = [f for p in files for f in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert not long, "functions over 80 lines: split them into named steps:\n" + "\n".join(long)
    assert len((ROOT / "app.py").read_text().splitlines()) <= MAX_APP_LINES


def test_the_length_check_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n", "planted.py") == ["planted.py:1 f (81 lines)"]
    assert long_functions("def g():\n    return 1\n", "ok.py") == []


# --- floors, C units, sizes and method names (issue 53) ------------------------------------------------------------

# What specviz/core/ must never import: everything that builds on it. core/ is the floor under the engines: it may
# read the plain values (config, errors, events, metrics, methods, policy, paths) and the model loading (models/).
ABOVE_CORE = ("specviz.engines", "specviz.train", "specviz.ui", "specviz.serving", "specviz.cli", "specviz.check",
              "specviz.drafters", "specviz.hardware", "specviz.tuning", "specviz.whatif", "specviz.zerogpu")


def upward_imports(graph: dict[str, dict[str, int]], floor: str = "specviz.core",
                   above: tuple[str, ...] = ABOVE_CORE) -> list[str]:
    """'module (line n) -> what it imports' for each import from a module of `floor` into one of `above`."""
    inside = lambda name, prefix: name == prefix or name.startswith(prefix + ".")  # noqa: E731
    return [f"{m} (line {line}) -> {target}" for m, edges in sorted(graph.items()) if inside(m, floor)
            for target, line in sorted(edges.items()) if any(inside(target, a) for a in above)]


def test_core_imports_nothing_above_it():
    found = upward_imports(import_graph())
    assert not found, ("specviz/core/ imports from above it (lazy imports count): move the code up beside its users, "
                       "or hand core what it needs:\n" + "\n".join(found))


# What the decoding floor (the engines, the drafters, core/ and the model loading) must never import: training, the
# app, the server, the command line and the checks all build on it.
ABOVE_ENGINES = ("specviz.train", "specviz.ui", "specviz.serving", "specviz.cli", "specviz.check")


def test_engines_import_nothing_from_train_or_the_app():
    graph = import_graph()
    found = [line for floor in ("specviz.engines", "specviz.drafters", "specviz.core", "specviz.models")
             for line in upward_imports(graph, floor=floor, above=ABOVE_ENGINES)]
    assert not found, ("the engines, drafters, core/ or models/ import from above them (lazy imports count): move "
                       "what they read down (e.g. specviz/core/answers.py), or hand it to them:\n" + "\n".join(found))


def test_the_floor_check_finds_a_planted_upward_import(tmp_path):
    """The real walk over a planted package: a lazy import inside a core function is found, a sibling is not."""
    pkg = tmp_path / "specviz"
    for folder in ("core", "engines"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from specviz.core import b\n\ndef f():\n    from specviz.engines import x\n")
    (pkg / "core" / "b.py").write_text("")
    (pkg / "engines" / "x.py").write_text("from specviz.core import a\n")
    files = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
             for p in pkg.rglob("*.py")}
    graph = {name: {t: line for t, line in reversed(
        [(t, line) for t, line in imports_of(path, name, set(files))])} for name, path in files.items()}
    assert upward_imports(graph) == ["specviz.core.a (line 4) -> specviz.engines.x"]


def imports_of(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """imports() for a file outside this checkout (the planted package above), named `name`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            source = resolve(node, name, path.name == "__init__.py")
            out += [(f"{source}.{a.name}" if f"{source}.{a.name}" in known else source, node.lineno)
                    for a in node.names if f"{source}.{a.name}" in known or source in known]
    return out


KERNELS = PACKAGE / "models" / "kernels"
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"", re.S)
C_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# a function defined at file scope (not static: static ones cannot be called from another unit)
C_DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)
C_PROTOTYPE = re.compile(r"^[A-Za-z_][\w \t*]*?\b[A-Za-z_]\w*\s*\([^;{}]*\)\s*;", re.M)  # a declaration, no call
C_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def c_text(path: Path, seen: set[Path] | None = None) -> str:
    """A unit's text without comments or strings, with the headers it #includes (their macros call too) inlined and
    their prototypes dropped (a declaration is no call)."""
    seen = set() if seen is None else seen
    seen.add(path)
    text = C_COMMENT.sub(" ", path.read_text())
    for name in C_INCLUDE.findall(text):
        header = path.parent / name
        if header.is_file() and header not in seen:
            text += "\n" + C_PROTOTYPE.sub(" ", c_text(header, seen))
    return text


def c_unit_graph(units: dict[str, str]) -> dict[str, dict[str, int]]:
    """unit -> {unit whose exported function it calls or whose file it #includes: 1}, from unit texts (c_text)."""
    defined = {u: set(C_DEFINITION.findall(t)) for u, t in units.items()}
    graph: dict[str, dict[str, int]] = {}
    for u, text in units.items():
        calls = set(C_CALL.findall(C_DEFINITION.sub(" ", text) + " " + " ".join(
            body for body in re.findall(r"\{(.*)", text, re.S))))
        graph[u] = {v: 1 for v in units if v != u and (calls & defined[v] or f'"{v}"' in text)}
    return graph


def test_no_circle_between_the_c_units():
    units = {p.name: c_text(p) for p in sorted(KERNELS.glob("*.c"))}
    assert len(units) >= 4, sorted(units)
    graph = c_unit_graph(units)
    assert graph["llama.c"], "the parser sees llama.c call the packed matmul (RUN_PHASE's wait_phase at least)"
    found = [" -> ".join(c) for c in cycles(graph)]
    assert not found, ("the C kernels call each other in a circle: give the shared piece its own unit, or pass "
                       "values back instead of calling up:\n" + "\n".join(found))


def test_the_c_circle_finder_sees_the_old_phase_timer_circle():
    """packed_linear.c's wait_phase once called llama.c's phase_waited while llama.c called wait_phase."""
    units = {"llama.c": "void phase_waited(double ns) { x += ns; }\nvoid run(void) { wait_phase(p, 1); }\n",
             "packed_linear.c": "void phase_waited(double ns);\nvoid wait_phase(phase_t *ph, long n) {\n"
                                "    phase_waited(1.0);\n}\n"}
    units = {u: C_PROTOTYPE.sub(" ", t) for u, t in units.items()}
    assert cycles(c_unit_graph(units)) == [["llama.c", "packed_linear.c", "llama.c"]]
    units["packed_linear.c"] = "double wait_phase(phase_t *ph, long n) {\n    return 0.0;\n}\n"
    assert cycles(c_unit_graph(units)) == []


MAX_MODULE_LINES = 500


def test_no_module_over_500_lines():
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in package_files().values()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 500 lines: split them by concern:\n" + "\n".join(long)


def method_comparisons(source: str, label: str, names: set[str]) -> list[str]:
    """'label:line: the comparison' for each ==, !=, in or not in of a method's name as a string literal (alone or in a
    literal tuple, list or set): what a method is belongs to its registry entry (specviz/methods.py)."""
    found = []

    def literals(node) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [v for e in node.elts for v in literals(e)]
        return []

    def names_a_method(node) -> bool:  # `x.method`, `x.kind`, `x.name`, `method`, `kind`
        return (isinstance(node, ast.Attribute) and node.attr in ("method", "kind", "name")
                or isinstance(node, ast.Name) and node.id in ("method", "kind"))

    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            sides = (node.left, *node.comparators)
            hit = [v for side in sides for v in literals(side)
                   if v in names - COMMON_WORDS or v in names and any(names_a_method(s) for s in sides)]
            if hit:
                found.append(f"{label}:{node.lineno}: {ast.unparse(node)}")
    return found


# Method names that are also ordinary words here: "ar" names the race's plain lane ("ar" beside "spec") and "draft" a
# drafted position (pos["kind"] == "draft" beside "prompt"). Compared with a literal they count only against a
# method-like operand (x.method, x.kind, x.name, method, kind); every other method name counts wherever it is compared.
COMMON_WORDS = {"ar", "draft"}


def method_names() -> set[str]:
    """The registry's method names, read from methods.py's source (nothing imported): each MethodSpec's first
    argument."""
    tree = ast.parse((PACKAGE / "methods.py").read_text())
    names = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
             "MethodSpec" and n.args and isinstance(n.args[0], ast.Constant)}
    assert {"ar", "eagle", "medusa", "pld"} <= names, names
    return names


def test_no_method_name_compared_outside_the_registry():
    names = method_names()
    found = [f for p in checked_files() if p != PACKAGE / "methods.py"
             for f in method_comparisons(p.read_text(), str(p.relative_to(ROOT)), names)]
    assert not found, ("method names compared outside specviz/methods.py: ask the registry (a MethodSpec field) "
                       "instead:\n" + "\n".join(found))


def test_the_method_name_check_sees_each_form():
    planted = ('if cfg.kind == "eagle":\n    pass\nx = m in ("pld", "z")\ny = "medusa" != k\nz = k == "spec"\n'
               'a = pos["kind"] == "draft"\nb = cfg.method == "draft"\nc = lane == "ar"\nd = kind in ("ar", "x")\n')
    assert method_comparisons(planted, "p.py", {"eagle", "pld", "medusa", "draft", "ar"}) == [
        "p.py:1: cfg.kind == 'eagle'", "p.py:3: m in ('pld', 'z')", "p.py:4: 'medusa' != k",
        "p.py:7: cfg.method == 'draft'", "p.py:9: kind in ('ar', 'x')"]
