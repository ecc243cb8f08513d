"""The package's layers hold: zmqrl.bus imports nothing from zmqrl.parts or zmqrl.run,
zmqrl.parts nothing from zmqrl.run, neither imports the node programs (nodes/), and no
module of zmqrl or nodes imports in a cycle — counting imports inside functions and
under TYPE_CHECKING, since a cycle there is still a knot a reader must untie."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

RANK = {"bus": 0, "parts": 1, "run": 2}


def _modules() -> dict[str, tuple[Path, set[str]]]:
    """Every module of zmqrl/ and nodes/, with the zmqrl/nodes modules it imports."""
    found = {}
    for base in ("zmqrl", "nodes"):
        for path in (REPO / base).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            name = name.removesuffix(".__init__")
            imports = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imports.add(node.module)
                    imports |= {f"{node.module}.{a.name}" for a in node.names}
                elif isinstance(node, ast.Import):
                    imports |= {a.name for a in node.names}
            found[name] = (path, {i for i in imports if i.split(".")[0] in ("zmqrl", "nodes")})
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "zmqrl" and len(parts) > 2 and parts[1] in RANK else None


def test_a_lower_layer_never_imports_a_higher_one():
    wrong = []
    for name, (_, imports) in _modules().items():
        mine = _layer(name)
        if mine is None:
            continue
        for target in imports:
            theirs = _layer(target)
            if target.split(".")[0] == "nodes" or (theirs and RANK[theirs] > RANK[mine]):
                wrong.append(f"{name} ({mine}) imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_in_a_cycle():
    modules = _modules()
    graph = {name: {t for t in imports if t in modules and t != name}
             for name, (_, imports) in modules.items()}
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    assert not cycles, cycles


def test_the_package_top_level_is_the_three_layers_the_registry_and_the_cli():
    top = {p.stem for p in (REPO / "zmqrl").iterdir()
           if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert top == {"__init__", "bus", "parts", "run", "plugins", "cli"}, top
