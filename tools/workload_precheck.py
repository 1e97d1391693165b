"""The workload pre-check on probe-only cells, no calibration (docs/notes/2026-12-01-workload-precheck.md).

    targets T N CAP MIN_ISL MAX_ISL OUT.parquet   # N embedded requests with ISL in [MIN_ISL, MAX_ISL], EOS or CAP
    probe T BUDGETS N CAP TARGETS RULE OUT_DIR     # probe N of them (cut to CAP tokens) at each budget, pre-check

Targets are generated as `rift-ada bench` does (batched, seed 0 + request index, ending at EOS or the cap);
the probe uses arms 0/8/16 + stat + full and the pre-check periodic:16 as the densest interval, position
bins of 32. One torch thread (run it with nice).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch


def targets(temperature: float, n: int, cap: int, min_isl: int, max_isl: int, out: str) -> None:
    from rift_ada.collectors.loops import repeated_ngram_share
    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests
    from rift_ada.experiments.bench import bench_size, select_requests

    pair = load_pair("smollm2-135m")
    size = replace(bench_size("small", n_requests=n, max_isl=max_isl), min_isl=min_isl)
    requests = select_requests(load_requests("embedded", pair.tokenizer), size)
    started = time.time()
    rows = ensure_targets(
        pair, requests, out, temperature=temperature, seed=0, max_new_tokens=cap, min_new_tokens=0, batch_size=n,
        on_request=lambda rid, k: print("done", rid, k, flush=True),
    )  # fmt: skip
    eos = pair.tokenizer.eos_token_id
    for row in rows:
        ids = row["response_token_ids"]
        print(row["request_id"], row["isl"], len(ids), ids[-1] == eos, round(repeated_ngram_share(ids, 4), 3))
    print("secs", time.time() - started)


def probe(temperature: float, budgets: list[int], n: int, cap: int, source: str, rule: str, out: Path) -> None:
    import glob

    from rift_ada.calibrate.export import json_safe
    from rift_ada.calibrate.precheck import PreCheck
    from rift_ada.collectors.collect import CollectSettings
    from rift_ada.collectors.loops import LoopDetector
    from rift_ada.collectors.pipeline import load_pair, load_requests, run_collection
    from rift_ada.collectors.targets.files import read_targets
    from rift_ada.collectors.trace_io import read_probe_traces

    pair = load_pair("smollm2-135m")
    if Path(source).is_file():
        rows = read_targets(source)
    else:  # the parts folder of an unfinished targets run
        rows = [read_targets(path)[0] for path in sorted(glob.glob(source + "/*.parquet"))]
    report = LoopDetector(rule=rule).report_rows(rows)
    print("loops", json.dumps({k: round(v, 3) for k, v in report.shares.items()}), "looping", len(report.looping))
    keep = [row for row in rows if row["request_id"] in set(report.kept)][:n]
    for row in keep:
        row["response_token_ids"] = row["response_token_ids"][:cap]
    ids = {row["request_id"] for row in keep}
    requests = [request for request in load_requests("embedded", pair.tokenizer) if request.request_id in ids]
    print("requests", [(r["request_id"], r["isl"], len(r["response_token_ids"])) for r in keep], flush=True)
    results = {}
    for budget in budgets:
        started = time.time()
        settings = CollectSettings(
            draft=pair.preset.draft, target=pair.preset.target_name, temperature=temperature, seed=0, budget=budget,
            arm_ages=(0, 8, 16), dataset="embedded",
        )  # fmt: skip
        folder = out / f"T{temperature:g}_B{budget}"
        run_collection(pair, requests, keep, folder, settings, mode="probe")
        check = PreCheck(intervals=(16,), position_bin=32, seed=0).run(read_probe_traces(folder))
        check["probe_seconds"] = round(time.time() - started, 1)
        results[f"T{temperature:g} B{budget}"] = check
        headroom = check["headroom"]
        print(
            f"T{temperature:g} B{budget}: stat {check['policies']['stat']['mean_al']:.3f} "
            f"p16 {check['policies']['periodic:16']['mean_al']:.3f} full {check['policies']['full']['mean_al']:.3f} "
            f"headroom {headroom['estimate']:+.3f} [{headroom['low']:+.3f}, {headroom['high']:+.3f}] "
            f"sd {headroom['sd']:.3f} secs {check['probe_seconds']}",
            flush=True,
        )
        (out / f"precheck_T{temperature:g}.json").write_text(
            json.dumps(json_safe({"loops": report.to_dict(), "cells": results}), indent=1)
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    command, *args = sys.argv[1:]
    if command == "targets":
        targets(float(args[0]), int(args[1]), int(args[2]), int(args[3]), int(args[4]), args[5])
    elif command == "probe":
        budgets = [int(b) for b in args[1].split(",")]
        probe(float(args[0]), budgets, int(args[2]), int(args[3]), args[4], args[5], Path(args[6]))
    else:
        raise SystemExit(__doc__)
