"""Count the project's imports: at module level vs inside functions (issue 14's "imports inside functions").

    python scripts/import_counts.py            # totals
    python scripts/import_counts.py --list     # every import inside a function, file:line (--own: ours only)

Counts `import` / `from ... import` statements in the packages (lab, checkers, nemesis, workloads); an import
under `if TYPE_CHECKING:` counts as module level (it never runs). Uses only the standard library's `ast`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lab", "checkers", "nemesis", "workloads")


def count(root: Path = ROOT, first_party: bool = False) -> tuple[int, int, list[str]]:
    """(module-level imports, imports inside functions, "file:line module" of each inside one).

    `first_party`: count only imports of the project's own packages (the ones that can make cycles).
    """
    top = inner = 0
    where: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node, in_function in _imports(tree):
                name = (node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name
                own = getattr(node, "level", 0) > 0 or name.split(".")[0] in PACKAGES
                if first_party and not own:
                    continue
                if in_function:
                    inner += 1
                    where.append(f"{path.relative_to(root)}:{node.lineno} {name}")
                else:
                    top += 1
    return top, inner, where


def _imports(tree: ast.AST):
    """(import node, is it inside a function) for every import statement."""
    stack = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            stack.append((child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                         ast.Lambda))))


if __name__ == "__main__":
    top, inner, where = count()
    own_top, own_inner, own_where = count(first_party=True)
    if "--list" in sys.argv:
        print("\n".join(sorted(own_where if "--own" in sys.argv else where)))
    print(f"all imports: {top} at module level, {inner} inside functions")
    print(f"imports of the project's own modules: {own_top} at module level, {own_inner} inside functions")
