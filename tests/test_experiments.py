"""The probe scripts in experiments/probes/ live apart from the product and no test runs them (most load models and
run for minutes), so they would rot silently: here each one compiles, and every specviz name it uses still resolves,
through public names only. Read as text; nothing is run and no result in experiments/results/ is read."""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
import types
import typing
from pathlib import Path

import pytest

PROBES_DIR = Path(__file__).resolve().parent.parent / "experiments" / "probes"
PROBES = sorted(PROBES_DIR.glob("*.py"))
LOCAL = {p.stem for p in PROBES}  # helpers beside the probes (timing.py), importable since Python puts it on the path


def resolve_module_attr(module: types.ModuleType, name: str):
    """module.name, or the submodule module.name where it is not imported yet; AttributeError where neither is."""
    if hasattr(module, name):
        return getattr(module, name)
    try:
        return importlib.import_module(f"{module.__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"{module.__name__} has no {name!r}") from None


def specviz_bindings(tree: ast.Module, problems: list[str]) -> dict[str, object]:
    """The names the file binds by importing from specviz (anywhere in it), each to the object it binds."""
    bound: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "specviz":
                    continue
                try:
                    module = importlib.import_module(alias.name)
                except ImportError as exc:
                    problems.append(f"line {node.lineno}: import {alias.name}: {exc}")
                    continue
                if alias.asname:
                    bound[alias.asname] = module
                else:
                    bound["specviz"] = importlib.import_module("specviz")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "specviz":
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                problems.append(f"line {node.lineno}: from {node.module} import ...: {exc}")
                continue
            for alias in node.names:
                if alias.name.startswith("_"):
                    problems.append(f"line {node.lineno}: from {node.module} import {alias.name}: a private name")
                try:
                    bound[alias.asname or alias.name] = resolve_module_attr(module, alias.name)
                except AttributeError as exc:
                    problems.append(f"line {node.lineno}: from {node.module} import {alias.name}: {exc}")
    return bound


def attribute_chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """`a.b.c` -> ("a", ["b", "c"]); None where the chain does not start at a plain name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return (node.id, names[::-1]) if isinstance(node, ast.Name) else None


def resolve_chain(obj, names: list[str], where: str, problems: list[str]):
    """Follow `names` from obj through modules and classes (an attribute of anything else, an instance, may be set
    at run time: not checked). Returns the last object reached, or None where a name is missing or private."""
    for name in names:
        if not isinstance(obj, (types.ModuleType, type)):
            return None
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
            problems.append(f"{where}: {name!r} is private to {getattr(obj, '__name__', obj)}: use a public name")
            return None
        try:
            obj = resolve_module_attr(obj, name) if isinstance(obj, types.ModuleType) else getattr(obj, name)
        except AttributeError:
            problems.append(f"{where}: {getattr(obj, '__name__', obj)} has no {name!r}")
            return None
    return obj


def check_call(func, call: ast.Call, where: str, problems: list[str]) -> None:
    """The call's keywords (and number of positional arguments) fit func's signature."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    try:
        signature.bind_partial(*[None] * len(call.args), **{k.arg: None for k in call.keywords})
    except TypeError as exc:
        problems.append(f"{where}: {getattr(func, '__qualname__', func)}(...): {exc}")


def specviz_class(obj) -> type | None:
    return obj if isinstance(obj, type) and obj.__module__.split(".")[0] == "specviz" else None


def returned_class(func) -> type | None:
    """The specviz class a call of func gives: the class itself, or what the function's return annotation names."""
    if specviz_class(func):
        return func
    try:
        hint = typing.get_type_hints(func).get("return")
    except Exception:  # an annotation that does not evaluate here: not checked
        return None
    return specviz_class(hint)


@functools.lru_cache(maxsize=None)
def instance_attributes(cls: type) -> frozenset[str] | None:
    """What an instance of cls has: its class's attributes, dataclass fields and every `self.NAME = ...` in the
    source of it and its specviz bases; None where __getattr__ makes any name possible."""
    if any("__getattr__" in vars(k) for k in cls.__mro__ if k is not object):
        return None
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    for klass in cls.__mro__:
        if not specviz_class(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return frozenset(names)


def instances(tree: ast.Module, bound: dict[str, object]) -> dict[str, type]:
    """Names assigned exactly once in the file, from a call that gives a specviz class's instance."""
    stores: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs:
                stores[arg.arg] = stores.get(arg.arg, 0) + 1
    found = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and stores.get(node.targets[0].id) == 1):
            continue
        func = node.value.func
        if isinstance(func, ast.Name) and func.id in bound:
            cls = returned_class(bound[func.id])
        elif isinstance(func, ast.Attribute) and (chain := attribute_chain(func)) and chain[0] in bound:
            cls = returned_class(resolve_chain(bound[chain[0]], chain[1], "", []))
        else:
            cls = None
        if cls is not None:
            found[node.targets[0].id] = cls
    return found


def local_names(stem: str) -> set[str]:
    tree = ast.parse((PROBES_DIR / f"{stem}.py").read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_there_are_probes():
    assert len(PROBES) >= 10 and (PROBES_DIR / "timing.py").is_file()


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_compiles_and_its_specviz_names_resolve(probe: Path):
    source = probe.read_text(encoding="utf-8")
    compile(source, str(probe), "exec")
    tree = ast.parse(source, str(probe))
    for parent in ast.walk(tree):  # only the outermost attribute of a chain is checked, once
        for child in ast.iter_child_nodes(parent):
            child.parent = parent
    problems: list[str] = []
    assert "assets/bench" not in source, "assets/bench/ is gone: experiments/probes/ and experiments/results/ now"
    bound = specviz_bindings(tree, problems)
    if bound:
        assert "sys.path.insert" in source, "imports specviz without putting the repo root on sys.path first"
    objects = instances(tree, bound)  # `target = models.get()`: target.NAME must be a LoadedModel's
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in objects
                and isinstance(node.ctx, ast.Load)):
            cls = objects[node.value.id]
            known = instance_attributes(cls)
            if known is not None and node.attr not in known:
                problems.append(f"line {node.lineno}: {node.value.id}.{node.attr}: a {cls.__name__} has no "
                                f"{node.attr!r}")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in LOCAL:
            missing = {a.name for a in node.names} - local_names(node.module)
            if missing:
                problems.append(f"line {node.lineno}: {node.module}.py defines no {sorted(missing)}")
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            chain = attribute_chain(node)
            if chain and chain[0] in bound:  # a store (a monkeypatch) too: the name it replaces must exist
                where = f"line {node.lineno}: {chain[0]}.{'.'.join(chain[1])}"
                resolve_chain(bound[chain[0]], chain[1], where, problems)
        if isinstance(node, ast.Call):
            func = None
            if isinstance(node.func, ast.Name) and node.func.id in bound:
                func = bound[node.func.id]
            elif isinstance(node.func, ast.Attribute):
                chain = attribute_chain(node.func)
                if chain and chain[0] in bound:
                    func = resolve_chain(bound[chain[0]], chain[1], f"line {node.lineno}", [])
            if callable(func):
                check_call(func, node, f"line {node.lineno}", problems)
    assert not problems, f"{probe.name}:\n" + "\n".join(problems)
