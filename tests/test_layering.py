"""DESIGN.md's one-way dependencies: cli -> calibrate (and train) -> policies -> collectors -> rift_ada's runtime.

Checked on the source with the AST, lazy imports inside functions included, so a helper that reaches back up
a layer (policies/score.py once imported calibrate/grids for its walks) fails here."""

from __future__ import annotations

import ast
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
