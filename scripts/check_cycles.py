"""No import cycles among the modules of agent/ and pipelines/ (run by `make lint`).

import-linter's acyclic_siblings contract (pyproject.toml) finds cycles between sibling
packages and modules; this finds any cycle of modules, also one through a package's
`__init__` (a module importing the package that imports it). Every import statement
counts, also those inside functions and under TYPE_CHECKING. Standard library only.
Exits 1 and prints each cycle found.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = ("agent", "pipelines")


def modules(top: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in ROOTS:
        for path in sorted((top / root).rglob("*.py")):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # `import a.b.c` of a name inside a.b
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
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
                    found.append(sorted(component))
    return found


def main() -> int:
    top = Path(__file__).resolve().parent.parent
    found = modules(top)
    graph = {name: imports(name, path, set(found)) for name, path in found.items()}
    bad = cycles(graph)
    for component in bad:
        print("import cycle:", " <-> ".join(component), file=sys.stderr)
    if not bad:
        print(f"no import cycles among {len(graph)} modules")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
