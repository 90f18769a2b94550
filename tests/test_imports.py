"""The package's imports form no cycle, not even through an import inside a
function (the style rule: a deferred import that hides a cycle is a cycle)."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIMPORT = re.compile(r"^\s*(?:from\s+(nsqshm[\w.]*)\s+c?import|c?import\s+(nsqshm[\w.]*))", re.M)


def modules():
    """{dotted name: path} of every .py and .pyx under nsqshm/."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "nsqshm")):
        for name in files:
            stem, ext = os.path.splitext(name)
            if ext not in (".py", ".pyx"):
                continue
            path = os.path.join(dirpath, name)
            dotted = os.path.relpath(os.path.join(dirpath, stem), ROOT).replace(os.sep, ".")
            out[dotted.removesuffix(".__init__")] = path
    return out


def imports_of(name, path, known):
    """The modules of `known` that module `name` imports, anywhere in it.  A
    `from package import submodule` depends on the submodule (and on the
    package only for names that are not submodules)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".pyx"):
        return {m.group(1) or m.group(2) for m in CIMPORT.finditer(source)} & known.keys()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            deps.update(subs)
            if len(subs) < len(node.names):
                deps.add(base)
    return (deps & known.keys()) - {name}


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_cycles_finds_what_there_is(graph, expected):
    assert cycles(graph) == expected


def test_a_deferred_import_counts(tmp_path):
    known = {"nsqshm.x": "", "nsqshm.y": ""}
    path = tmp_path / "x.py"
    path.write_text("def f():\n    from nsqshm.y import g\n")
    assert imports_of("nsqshm.x", str(path), known) == {"nsqshm.y"}


def test_the_package_has_no_import_cycle():
    known = modules()
    assert len(known) > 100
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []
