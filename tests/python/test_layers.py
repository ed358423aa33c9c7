"""The package's import structure: no module imports one that imports it back, and each layer imports only
the layers below it (docs/architecture.md, "Layers").

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of a ``gfdit`` module,
at module level or inside a function (a lazy import closes a circle as surely as an eager one). ``from P
import X`` counts as an import of ``P.X`` when that is a module, else of ``P``.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
PACKAGE = os.path.join(ROOT, "gfdit")

# Bottom to top; a module may import its own layer's modules and those of lower layers.
LAYERS = (
    ("gfdit._C", "gfdit.plots", "gfdit.settings", "gfdit.stats"),
    ("gfdit.comm",),
    ("gfdit.attention",),
    ("gfdit.models",),
    ("gfdit.planning",),
    ("gfdit.serving",),
    ("gfdit.tools",),
    ("gfdit", "gfdit.__main__"),
)


def _modules() -> dict[str, str]:
    mods = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the gfdit modules it imports (the extension ``gfdit._C`` is a leaf)."""
    mods = _modules()
    known = set(mods) | {"gfdit._C"}

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {"gfdit._C": set()}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith("__init__.py")
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".") if is_package else mod.split(".")[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            out |= {t for t in map(resolve, (t for t in targets if t.split(".")[0] == "gfdit")) if t}
        out.discard(mod)
        graph[mod] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for level, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = level, len(p)
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return best


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def test_each_layer_imports_only_the_layers_below():
    graph = import_graph()
    upward = sorted(
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in graph.items()
        for t in targets
        if layer_of(t) > layer_of(m)
    )
    assert upward == []


def test_the_checker_finds_a_circle_and_an_upward_import():
    graph = {
        "gfdit.comm.a": {"gfdit.comm.b"},
        "gfdit.comm.b": {"gfdit.serving.c"},
        "gfdit.serving.c": {"gfdit.comm.a"},
    }
    assert cycles(graph) == [["gfdit.comm.a", "gfdit.comm.b", "gfdit.serving.c"]]
    assert layer_of("gfdit.comm.b") < layer_of("gfdit.serving.c")
    with pytest.raises(AssertionError):
        layer_of("numpy")
