"""Imports flow one way: foundations -> engine -> projections -> commands -> cli.

Walks every module of sync/ and projections/ (its source, with ast: nothing is
imported) and checks, for every import of a project module, at module level or inside
a function alike (annotations under `if TYPE_CHECKING:` excepted):
  - it goes to the same layer or a lower one;
  - the graph of all of them has no cycle, so no import sits inside a function to dodge
    one (an import inside a function is there only to defer a slow library, e.g. the
    command line's, and would be legal at the top as well).
Run it alone: `.venv/bin/python -m pytest tests/unit/test_layers.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sync", "projections")

# The first prefix that matches a module's name gives its layer.
LAYERS = [
    ("cli", ["sync.cli", "sync.__main__"]),
    ("commands", ["sync.commands", "sync.demo", "sync.bench"]),
    ("projections", ["projections"]),
    ("engine", ["sync.cdc", "sync.delta", "sync.streaming", "sync.stack", "sync.outbox", "sync.search"]),
    ("foundations", ["sync.config", "sync.errors", "sync.fault", "sync.files", "sync.lake", "sync.projection",
                     "sync.compare", "sync"]),
]
RANK = {name: rank for rank, (name, _) in enumerate(reversed(LAYERS))}


def layer(module: str) -> str:
    for name, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports, and their parent packages (importing a
    module runs its packages' __init__ first), but for the importer's own packages,
    which run before it anyway."""
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        targets: set[str] = set()
        own = {".".join(module.split(".")[:n]) for n in range(1, module.count(".") + 1)}
        for node in ast.walk(tree):
            if _type_checking_only(node, parents):
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                         for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in PACKAGES:
                    continue
                parts = name.split(".")
                packages = {".".join(parts[:n]) for n in range(1, len(parts))} - own
                targets |= ({name} | packages) & set(known)
        graph[module] = targets - {module}
    return graph


def test_every_import_goes_to_the_same_layer_or_below():
    graph = imports(modules())
    upward = sorted(f"{m} ({layer(m)}) imports {t} ({layer(t)})" for m, targets in graph.items() for t in targets
                    if RANK[layer(t)] > RANK[layer(m)])
    assert upward == []


def test_the_import_graph_has_no_cycle():
    graph = imports(modules())
    done: set[str] = set()
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(" -> ".join(path[path.index(module):] + [module]))
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


def test_the_walk_sees_the_project():
    known = modules()
    graph = imports(known)
    assert {"sync.projection", "sync.commands", "projections.mirrors", "projections.event_time.batch"} <= set(known)
    assert "sync.projection" in graph["projections.mirrors"]      # a module-level import
    assert "sync.commands.verify" in graph["sync.cli"]            # an import inside a function
    assert "sync.compare" not in graph["sync.projection"]         # an annotation under TYPE_CHECKING
