"""benchmarks/fault_injection.py --quick: a preempted and a full-disk `targets` run resume to the reference."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARK = Path(__file__).parent.parent / "benchmarks" / "fault_injection.py"


def test_quick_fault_injection_has_no_mismatch(tiny_model_dir, tmp_path):
    spec = importlib.util.spec_from_file_location("fault_injection", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    out = tmp_path / "faults.json"
    code = module.main(["--quick", "--seed", "1", "--grace", "2", "--model", str(tiny_model_dir), "--json", str(out)])
    result = json.loads(out.read_text())["stages"]["targets"]
    assert code == 0, result
    assert result["runs"] == 1 and result["disk_runs"] == 1
    assert result["mismatches"] == result["tracebacks"] == result["unnamed"] == 0, result["notes"]
    assert result["sigkills"] == 0, result  # a SIGTERMed run exits within the grace period
    if not any("no tmpfs" in note for note in result["notes"]):
        assert result["disk_full"] == 1, result  # the tmpfs was smaller than the run needs
