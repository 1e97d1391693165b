"""DESIGN.md's one-way dependencies: cli -> experiments -> calibrate (and train) -> policies -> collectors -> rift_ada's
runtime, and calibrate/ free of model code.

Checked on the source with the AST, lazy imports inside functions included, so a helper that reaches back up
a layer (policies/score.py once imported calibrate/grids for its walks) fails here."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> its layer (higher imports lower); the runtime is every other rift_ada module
LAYERS = {"cli": 5, "experiments": 4, "calibrate": 3, "train": 3, "policies": 2, "collectors": 1, "rift_ada": 0}
MODEL_CODE = ("torch", "transformers")
# what calibrate/ may read from collectors/: the probe traces (the one hand-over from models) and their reader
TRACE_MODULES = ("rift_ada.collectors", "rift_ada.collectors.probe_traces", "rift_ada.collectors.trace_io")


def _is_trace_module(module: str) -> bool:
    return module in TRACE_MODULES or module.startswith("rift_ada.collectors.trace_io.")


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "rift_ada":
        return None
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 0


@functools.cache
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(_parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _imports_and_submodules(path: Path) -> list[tuple[int, str]]:
    """:func:`_imports` plus ``m.name`` for every ``from m import name`` (``from rift_ada import speculative``)."""
    found = _imports(path)
    for node in ast.walk(_parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _source(module: str) -> Path | None:
    """The file of a first-party module (``rift_ada.collectors.trace_io`` -> collectors/trace_io.py)."""
    parts = module.split(".")
    if parts[0] != "rift_ada":
        return None
    folder = len(parts) > 1 and parts[1] in LAYERS and parts[1] != "rift_ada"  # a top-level folder (package-dir)
    base, rest = (ROOT / parts[1], parts[2:]) if folder else (ROOT / "rift_ada", parts[1:])
    for path in (base.joinpath(*rest).with_suffix(".py") if rest else None, base.joinpath(*rest, "__init__.py")):
        if path is not None and path.is_file():
            return path
    return None


def _reached(module: str) -> list[str]:
    """``module``'s first-party imports, direct and through the modules they import (their packages' __init__
    included), lazy ones too: what importing it and calling its functions can load."""
    seen: list[str] = []
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for candidate in [".".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            if candidate not in seen and _source(candidate) is not None:
                seen.append(candidate)
                path = _source(candidate)
                assert path is not None
                todo += [imported for _, imported in _imports_and_submodules(path)]
    return seen


def _model_imports(module: str) -> list[str]:
    """Where ``module``, directly or through first-party modules it reaches, imports torch or transformers."""
    found = []
    for name in _reached(module):
        path = _source(name)
        assert path is not None
        for line, imported in _imports(path):
            if imported.split(".")[0] in MODEL_CODE:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
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


def _model_free_offences(path: Path) -> list[tuple[int, str]]:
    """The imports of ``path`` a model-free module must not have (submodules named in ``from m import name`` too)."""
    offending = []
    for line, module in _imports_and_submodules(path):
        if module not in [m for _, m in _imports(path)] and _source(module) is None:
            continue  # ``from m import name``: a name, not a module
        model = module.split(".")[0] in MODEL_CODE
        collectors = module.startswith("rift_ada.collectors") and not _is_trace_module(module)
        if model or collectors or module.startswith("rift_ada.experiments"):
            offending.append((line, module))
    return offending


def test_calibrate_imports_no_model_code():
    """calibrate/ is model-free: no torch or transformers, no collectors module but the trace hand-over, no
    experiments, and none of these reached through the first-party modules it does import."""
    offending = []
    for path in sorted((ROOT / "calibrate").rglob("*.py")):
        offending += [f"{path.relative_to(ROOT)}:{n} imports {module}" for n, module in _model_free_offences(path)]
        module = "rift_ada.calibrate" + ("" if path.stem == "__init__" else f".{path.stem}")
        offending += [f"{module} reaches {found}" for found in _model_imports(module)]
    assert not offending, "model code in calibrate/:\n" + "\n".join(offending)


def test_the_model_scan_follows_first_party_imports(tmp_path):
    """The scan reaches torch through a first-party module: the closed loop's collectors and the bench do."""
    assert _source("rift_ada.collectors.probe_traces") == ROOT / "collectors" / "probe_traces.py"
    assert _source("rift_ada.experiments") == ROOT / "experiments" / "__init__.py"
    assert _source("numpy") is None and _source("rift_ada.no_such_module") is None
    assert any("rift_ada/speculative.py" in line for line in _model_imports("rift_ada.collectors.collect"))
    assert _model_imports("rift_ada.experiments.bench")  # experiments may run models
    assert "rift_ada.collectors.probe_traces" in _reached("rift_ada.calibrate.splits")
    assert not _model_imports("rift_ada.controller")
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from rift_ada import speculative\n    return speculative\n", encoding="utf-8")
    assert (2, "rift_ada.speculative") in _imports_and_submodules(lazy)
    assert _model_imports("rift_ada.speculative")
    imports = tmp_path / "imports.py"
    imports.write_text(
        "from rift_ada.collectors import collect\nfrom rift_ada.collectors.trace_io import read_manifest\n"
        "from rift_ada.collectors.probe_traces import ProbeTraces\nimport torch.nn\n"
        "from rift_ada.collectors.trace_io.readers import read_tables\n",
        encoding="utf-8",
    )
    assert _model_free_offences(imports) == [(4, "torch.nn"), (1, "rift_ada.collectors.collect")]


def _executed_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that running ``path`` can import, lazy imports inside functions included,
    ``if TYPE_CHECKING:`` blocks (never run) left out; ``from package import module`` is the module."""
    tree = _parse(path.read_text(encoding="utf-8"))
    unrun = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in unrun:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= submodules or ({node.module} & modules)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names} & modules
    return found


def _import_cycles(files: dict[str, Path]) -> list[list[str]]:
    """Import cycles among ``files`` (module name -> source), each from its first module back to it. A
    package's own ``__init__`` is left out of its submodules' imports: Python runs it before any of them."""
    graph = {
        module: {m for m in _executed_imports(path, set(files)) if m != module and not module.startswith(m + ".")}
        for module, path in files.items()
    }
    cycles = []
    for start in sorted(graph):
        todo, seen = [(start, [start])], {start}
        while todo:
            module, path = todo.pop()
            if start in graph[module]:
                cycles.append([*path, start])
                break
            for imported in sorted(graph[module] - seen):
                seen.add(imported)
                todo.append((imported, [*path, imported]))
    return cycles


def _runtime_files() -> dict[str, Path]:
    files = {}
    for path in sorted((ROOT / "rift_ada").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def test_runtime_modules_have_no_import_cycle():
    """cache -> attention, batch_cache -> cache and so on one way only: no runtime module reaches itself
    again through imports, lazy ones inside functions included (attention once imported batch_cache in one)."""
    files = _runtime_files()
    assert {"rift_ada.attention", "rift_ada.cache", "rift_ada.batch_cache", "rift_ada.speculative"} <= set(files)
    cycles = _import_cycles(files)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_scan_sees_a_lazy_import_and_skips_type_checking(tmp_path):
    low, high, typed = tmp_path / "low.py", tmp_path / "high.py", tmp_path / "typed.py"
    low.write_text("def f():\n    from pkg.high import g\n    return g\n", encoding="utf-8")
    high.write_text("from pkg.low import f\n", encoding="utf-8")
    typed.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import g\nfrom pkg import low\n",
        encoding="utf-8",
    )
    assert _import_cycles({"pkg.low": low, "pkg.high": high}) == [
        ["pkg.high", "pkg.low", "pkg.high"],
        ["pkg.low", "pkg.high", "pkg.low"],
    ]
    assert _executed_imports(typed, {"pkg.low", "pkg.high", "pkg"}) == {"pkg.low"}
