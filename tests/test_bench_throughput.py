"""benchmarks/bench_throughput.py --quick runs every stage at two batch sizes beside its roofline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_throughput.py"


def test_quick_throughput_benchmark_reports_every_cell_beside_its_floors(tmp_path: Path):
    out = tmp_path / "cells.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--profile", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    cells = {(cell["stage"], cell["batch"]): cell for cell in figures["cells"]}
    assert set(cells) == {(stage, batch) for stage in ("closed", "probe", "targets") for batch in (1, 4)}
    for cell in cells.values():
        assert cell["tok_s"] > 0 and cell["memory_tok_s"] > 0 and cell["compute_tok_s"] > 0
    assert cells[("closed", 4)]["tokens"] == 4 * cells[("closed", 1)]["tokens"]  # four requests of 16 tokens
    assert figures["bandwidth"] > 1e8 and max(figures["gemm"].values()) > 1e8
    groups = figures["profile"]["groups"]
    assert set(groups) == {"gemm", "attention", "cache ops", "other ops", "python and dispatch"}
    assert groups["gemm"] > 0 and sum(groups.values()) <= figures["profile"]["wall"] * 1.05
    assert "profile of one closed-loop round at batch 4" in done.stdout
