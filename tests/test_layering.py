"""DESIGN.md's one-way dependencies: cli -> calibrate (and train) -> policies -> collectors -> rift_ada's runtime.

Checked on the source with the AST, lazy imports inside functions included, so a helper that reaches back up
a layer (policies/score.py once imported calibrate/grids for its walks) fails here."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> its layer (higher imports lower); the runtime is every other rift_ada module
LAYERS = {"cli": 4, "calibrate": 3, "train": 3, "policies": 2, "collectors": 1, "rift_ada": 0}


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "rift_ada":
        return None
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 0


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_no_package_imports_a_layer_above_it():
    upward = []
    for folder, layer in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module in _imports(path):
                target = _layer_of(module)
                if target is not None and target > layer:
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not upward, "imports against DESIGN.md's direction:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The scan itself: a lazy import of calibrate inside a policies function is found."""
    source = tmp_path / "score.py"
    source.write_text("def f():\n    from rift_ada.calibrate.grids import x\n    return x\n", encoding="utf-8")
    assert [(line, module) for line, module in _imports(source)] == [(2, "rift_ada.calibrate.grids")]
    assert _layer_of("rift_ada.calibrate.grids") > LAYERS["policies"]
    assert _layer_of("rift_ada.controller") == 0 and _layer_of("numpy") is None


def _module_file(module: str) -> Path | None:
    """Source of a rift_ada module of the runtime folder (rift_ada/...), None for other layers."""
    parts = module.split(".")
    if parts[0] != "rift_ada" or (len(parts) > 1 and parts[1] in LAYERS):
        return None
    base = ROOT.joinpath("rift_ada", *parts[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _non_stdlib_imports(start: list[Path]) -> list[str]:
    """Imports outside the standard library reached from ``start`` through rift_ada runtime modules."""
    seen: set[Path] = set()
    todo = list(start)
    found = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for line, module in _imports(path):
            if module.split(".")[0] in sys.stdlib_module_names or module == "__future__":
                continue
            source = _module_file(module)
            if source is not None and source.is_file():
                todo.append(source)
            else:
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{shown}:{line} imports {module}")
    return found


def test_controller_and_policy_kinds_import_only_the_standard_library(tmp_path):
    """The Controller and the policy kinds it dispatches to stay importable without numpy or torch
    (lazy imports inside functions included), and the scan sees a numpy import where there is one."""
    kinds = sorted((ROOT / "rift_ada" / "policy_kinds").glob("*.py"))
    assert {p.stem for p in kinds} >= {"__init__", "base", "periodic", "gate", "score"}
    assert _non_stdlib_imports([ROOT / "rift_ada" / "controller.py", *kinds]) == []
    planted = tmp_path / "kind.py"
    planted.write_text("from rift_ada.policy_kinds import base\n\ndef f():\n    import numpy\n", encoding="utf-8")
    assert _non_stdlib_imports([planted]) == ["kind.py:4 imports numpy"]
