"""Count the project's imports: at module level vs inside functions (issues 14 and 17).

    python scripts/import_counts.py            # totals
    python scripts/import_counts.py --list     # every import inside a function, file:line (--own: ours only)

Counts `import` / `from ... import` statements in the packages (lab, checkers, nemesis, workloads); an import
under `if TYPE_CHECKING:` counts as module level (it never runs). An import inside a function needs a comment
saying why (`uncommented` lists those without). Uses only the standard library's `ast` and `tokenize`.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
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


def uncommented(root: Path = ROOT) -> list[str]:
    """"file:line module" of each import inside a function without a comment saying why: one on its own lines, or
    on the import right before it (one comment speaks for a run of adjacent imports)."""
    missing: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                         if tok.type == tokenize.COMMENT}
            said = {}  # end line of an import inside a function -> does it (or its run) say why
            for node in sorted((n for n, inside in _imports(ast.parse(text, str(path))) if inside),
                               key=lambda n: n.lineno):
                own = any(line in commented for line in range(node.lineno, node.end_lineno + 1))
                said[node.end_lineno] = own or said.get(node.lineno - 1, False)
                if not said[node.end_lineno]:
                    name = (node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name
                    missing.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return missing


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
    silent = uncommented()
    print(f"imports inside functions without a comment saying why: {len(silent)}", *silent, sep="\n  ")
