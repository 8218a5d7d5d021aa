"""The package's import graph, its layers, and the rules it keeps.

`python -m harness.devtools.imports` prints the layers of harness/ (and of analysis/, the figure
code beside it in a checkout, which sits above them all) in import order (lowest
first), each with its modules and what it imports from below; it exits 1 and names the
offending modules if the graph has a cycle, a module imports from a layer above its own, or a
module imports another module's private name (a leading underscore: that module's own business).

A layer is a top-level module or subpackage of harness (ops, layers, train, ...). LAYERS
orders them: a module may import from its own layer and from those before it. The graph is
read from the source with `ast` (every `import` and `from ... import`, also inside functions,
where the package defers heavy imports), so nothing of the harness is imported to draw it.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # harness/
ANALYSIS = ROOT.parent / "analysis"            # in a checkout; an installed wheel has none

# Lowest first. Each entry is a top-level module or subpackage of harness.
LAYERS = (
    ("base", ("errors", "env", "checks", "devices", "allocator", "peak_memory")),
    ("ops", ("ops", "features")),
    ("hooks", ("hooks",)),
    ("layers", ("layers",)),
    ("model", ("model",)),
    ("tasks", ("tasks",)),
    ("config", ("config", "conf")),
    ("measure", ("measure",)),
    ("outputs", ("outputs",)),
    ("train", ("train",)),
    ("bench", ("bench",)),
    ("run", ("run", "__main__", "__init__")),
    ("devtools", ("devtools",)),
    ("analysis", ()),          # the analysis package: it may import any layer of harness
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    paths = sorted(ROOT.rglob("*.py")) + (sorted(ANALYSIS.rglob("*.py")) if ANALYSIS.is_dir() else [])
    return {module_name(p): p for p in paths}


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports (a `from pkg import mod` counts as importing pkg.mod)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg itself
            base = _resolve(node, name, path.name == "__init__.py")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def private_imports(mods: dict[str, Path] | None = None) -> list[tuple[str, str]]:
    """(importer, "module.name") for every private name (one leading underscore) a module of the
    package (``mods``: modules()) imports from another of its modules."""
    mods = modules() if mods is None else mods
    found = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _resolve(node, name, path.name == "__init__.py")
            if base == name or base not in mods:
                continue
            found += [(name, f"{base}.{a.name}") for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(found)


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def layer_of(module: str) -> int:
    """Index in LAYERS of a dotted module name (the package root counts as `run`)."""
    parts = module.split(".")
    if parts[0] == "analysis":
        return len(LAYERS) - 1
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, members) in enumerate(LAYERS):
        if top in members:
            return i
    raise KeyError(f"{module}: its top-level name {top!r} is in no layer of LAYERS")


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each one a cycle."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(1000, 10 * len(g)))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports from a layer above its own."""
    return sorted((a, b) for a, deps in g.items() for b in deps if layer_of(b) > layer_of(a))


def report(g: dict[str, set[str]]) -> str:
    by_layer = defaultdict(list)
    for name in g:
        by_layer[layer_of(name)].append(name)
    lines = []
    for i, (label, _) in enumerate(LAYERS):
        names = sorted(by_layer.get(i, []))
        if not names:
            continue
        below = sorted({LAYERS[layer_of(d)][0] for n in names for d in g[n] if layer_of(d) < i})
        lines.append(f"{i:2d} {label:<9} {len(names):3d} modules"
                     + (f"   imports: {', '.join(below)}" if below else ""))
        for name in names:
            lines.append(f"     {name}")
    return "\n".join(lines)


def main() -> int:
    g = graph()
    print(report(g))
    bad = cycles(g)
    up = upward(g)
    private = private_imports()
    for comp in bad:
        print(f"cycle: {' -> '.join(comp)}", file=sys.stderr)
    for a, b in up:
        print(f"upward import: {a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})", file=sys.stderr)
    for a, b in private:
        print(f"private import: {a} imports {b}", file=sys.stderr)
    return 1 if bad or up or private else 0


if __name__ == "__main__":
    sys.exit(main())
