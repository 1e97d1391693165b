"""Count string branches on policy kind names and separate walkers over the any/all gate tree.

A *kind branch* is a comparison (``==``, ``!=``, ``in``, ``not in``, a ``match`` case) whose
constant side is a policy kind name ("periodic", "gate", "score") or a tuple/list/set holding one.
A *walker* is a function (def or lambda) whose body names both "any" and "all" as string constants
(each recursive or stack-based walk over the gate tree has to). Usage::

    python benchmarks/investigations/policy_kind_branches.py [ROOT]
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

KINDS = {"periodic", "gate", "score"}
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
FOLDERS = ("rift_ada", "policies", "calibrate", "collectors", "cli", "train")


def _names_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in KINDS for e in node.elts)
    return False


def scan(path: Path) -> tuple[int, int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    branches = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
            branches += any(_names_kind(side) for side in (node.left, *node.comparators))
        elif isinstance(node, ast.match_case) and _names_kind(getattr(node.pattern, "value", ast.Pass())):
            branches += 1
    walkers = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = [n for n in ast.walk(node) if n is not node]
            nested = {id(m) for n in inner if isinstance(n, (ast.FunctionDef, ast.Lambda)) for m in ast.walk(n)}
            strings = {n.value for n in inner if isinstance(n, ast.Constant) and id(n) not in nested}
            walkers += {"any", "all"} <= strings
    return branches, walkers


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    branches: Counter[str] = Counter()
    walkers: Counter[str] = Counter()
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            b, w = scan(path)
            name = str(path.relative_to(root))
            if b:
                branches[name] = b
            if w:
                walkers[name] = w
    print("kind branches per file:")
    for name, count in sorted(branches.items()):
        print(f"  {name}: {count}")
    print(f"  total: {sum(branches.values())} in {len(branches)} files")
    print("any/all walkers per file:")
    for name, count in sorted(walkers.items()):
        print(f"  {name}: {count}")
    print(f"  total: {sum(walkers.values())} in {len(walkers)} files")


if __name__ == "__main__":
    main()
