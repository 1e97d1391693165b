"""Fault injection: SIGKILL `rift-ada collect` and `rift-ada calibrate` at random points, rerun, compare.

Collection (a tiny random llama, probe mode, fixed targets): every killed run is rerun into the
same directory until it exits 0; its committed tables must equal an uninterrupted run's exactly.
Calibration (synthetic probe traces, no model): every killed run is rerun on the same run
directory (the same Optuna SQLite study); the study must end with exactly the asked number of
COMPLETE trials, none RUNNING or WAITING, every baseline once with the uninterrupted run's values,
and a valid controller. Whether the controller equals the uninterrupted run's is printed too: it
need not, because the sampler's random stream restarts with the rerun (docs/reliability.md).

    .venv/bin/python benchmarks/fault_injection.py --runs 3 --seed 0

Prints one line per run and a summary (runs, kills, mismatches); exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CLI = [sys.executable, "-m", "rift_ada.cli.app"]
PROMPTS = [
    "Explain, step by step, how a hash table resolves collisions with open addressing.",
    "List the planets of the solar system in order and give one fact about each.",
    "Describe how to make bread from flour, water, salt and yeast, one stage at a time.",
    "Walk through binary search on a sorted list of ten numbers, showing each comparison.",
    "Summarise the rules of chess for a beginner: the pieces, how they move, and how to win.",
    "Explain what a compiler does, phase by phase, from source text to machine code.",
]


def run_cli(arguments: list[str], *, kill_after: float | None = None) -> tuple[int, bool]:
    """(exit code, killed): run a CLI command, SIGKILLed after ``kill_after`` seconds if still running."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen([*CLI, *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if kill_after is not None:
        try:
            process.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return process.returncode, True
    _, stderr = process.communicate()
    if process.returncode != 0:
        sys.stderr.write(stderr.decode(errors="replace")[-2000:])
    return process.returncode, False


def until_done(arguments: list[str], kill_after: float, on_kill=None) -> tuple[int, int]:
    """Run once with a SIGKILL after ``kill_after`` s, then rerun (no kill) until it exits 0: (kills, reruns).

    ``on_kill`` is called right after a kill (to record what the killed run had written)."""
    code, killed = run_cli(arguments, kill_after=kill_after)
    kills, reruns = int(killed), 0
    if killed and on_kill is not None:
        on_kill()
    while code != 0 and reruns < 3:
        reruns += 1
        code, _ = run_cli(arguments)
    if code != 0:
        raise RuntimeError(f"rerun failed: {' '.join(arguments)}")
    return kills, reruns


# ----------------------------------------------------------------------------------------------
# Collection


def tiny_model(folder: Path) -> Path:
    """A 2-layer random llama with the embedded SmolLM2 tokenizer, saved as a local model directory."""
    import torch
    import transformers

    from rift_ada.models import PRESETS, load_tokenizer

    tokenizer = load_tokenizer(PRESETS["smollm2-135m"].draft)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def collection_trial(work: Path, runs: int, rng: np.random.Generator) -> dict[str, int]:
    from rift_ada.collectors.trace_io import read_tables

    model = tiny_model(work / "model")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(PROMPTS)))
    common = ["--model", str(model), "--dataset", f"jsonl:{prompts}", "--budget", "64", "--arm-ages", "0,16,32"]
    targets = work / "targets.parquet"
    if run_cli(["targets", *common[:4], "--out", str(targets), "--max-new-tokens", "96"])[0] != 0:
        raise RuntimeError("targets failed")
    collect = ["collect", *common, "--targets", str(targets)]
    start = time.monotonic()
    if run_cli([*collect, "--out", str(work / "reference")])[0] != 0:
        raise RuntimeError("reference collection failed")
    reference_s = time.monotonic() - start
    reference = read_tables(work / "reference")
    kills = mismatches = reruns = 0
    for index in range(runs):
        out = work / f"collect-{index}"
        kill_after = float(rng.uniform(0.3, 1.0) * reference_s)
        run_kills, run_reruns = until_done([*collect, "--out", str(out)], kill_after)
        kills, reruns = kills + run_kills, reruns + run_reruns
        tables = read_tables(out)
        same = tables.keys() == reference.keys() and all(tables[k].equals(reference[k]) for k in reference)
        mismatches += not same
        print(f"collect run {index}: kill at {kill_after:.1f}s of {reference_s:.1f}s, killed={bool(run_kills)}, "
              f"reruns={run_reruns}, tables equal={same}", flush=True)  # fmt: skip
    return {"runs": runs, "kills": kills, "reruns": reruns, "mismatches": mismatches}


# ----------------------------------------------------------------------------------------------
# Calibration


def study_summary(run_dir: Path, total: int) -> dict[str, object]:
    import optuna
    from optuna.trial import TrialState

    from rift_ada.calibrate.study import BASELINE_ATTR, open_storage

    storage = open_storage(f"sqlite:///{run_dir / 'study.db'}")
    names = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
    trials = optuna.load_study(study_name=names[0], storage=storage).get_trials(deepcopy=False) if names else []
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    return {
        "complete": len(complete),
        "running_or_waiting": sum(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials),
        "baselines": sorted(
            (t.user_attrs[BASELINE_ATTR], tuple(t.values)) for t in complete if t.user_attrs.get(BASELINE_ATTR)
        ),  # fmt: skip
        "total_ok": len(complete) == total,
    }


def calibration_trial(work: Path, runs: int, rng: np.random.Generator, trials: int) -> dict[str, int]:
    from rift_ada.collectors.synthetic import synthetic_traces
    from rift_ada.collectors.trace_io import write_probe_traces
    from rift_ada.controller import Controller

    model = work / "synthetic-model"
    model.mkdir()
    traces = synthetic_traces(24, 768, seed=7, segment_length=128)
    manifest = dict(traces.manifest, draft=str(model), target=str(model), dataset="synthetic", seed=0)
    probe = write_probe_traces(work / "probe", traces, manifest)

    def calibrate(run_dir: Path) -> list[str]:
        return ["calibrate", "-m", str(model), "-t", "0", "--traces", str(probe), "--out", str(run_dir),
                "--controller", str(run_dir / "exported.json"), "--trials", str(trials), "--seed", "3"]  # fmt: skip

    start = time.monotonic()
    if run_cli(calibrate(work / "cal-reference"))[0] != 0:
        raise RuntimeError("reference calibration failed")
    reference_s = time.monotonic() - start
    reference_controller = json.loads((work / "cal-reference" / "exported.json").read_text())
    reference_study = study_summary(work / "cal-reference", 0)
    kills = mismatches = reruns = same_controllers = 0
    for index in range(runs):
        run_dir = work / f"cal-{index}"
        kill_after = float(rng.uniform(0.3, 0.9) * reference_s)
        at_kill: dict[str, object] = {}

        def record(run_dir: Path = run_dir, at_kill: dict[str, object] = at_kill) -> None:
            if (run_dir / "study.db").exists():
                at_kill.update(study_summary(run_dir, 0))

        run_kills, run_reruns = until_done(calibrate(run_dir), kill_after, on_kill=record)
        kills, reruns = kills + run_kills, reruns + run_reruns
        summary = study_summary(run_dir, reference_study["complete"])
        controller = json.loads((run_dir / "exported.json").read_text())
        Controller.from_dict(controller)  # raises if invalid
        ok = (
            summary["total_ok"]
            and summary["running_or_waiting"] == 0
            and summary["baselines"] == reference_study["baselines"]
        )
        same = controller["policy"] == reference_controller["policy"]
        mismatches += not ok
        same_controllers += same
        baselines_equal = summary["baselines"] == reference_study["baselines"]
        killed_at = (f"{at_kill.get('complete')} complete + {at_kill.get('running_or_waiting')} running"
                     if at_kill else "no study yet")  # fmt: skip
        print(f"calibrate run {index}: kill at {kill_after:.1f}s of {reference_s:.1f}s, killed={bool(run_kills)} "
              f"({killed_at}), reruns={run_reruns}, complete={summary['complete']}/{reference_study['complete']}, "
              f"running/waiting={summary['running_or_waiting']}, baselines equal={baselines_equal}, "
              f"same controller={same}", flush=True)  # fmt: skip
    return {"runs": runs, "kills": kills, "reruns": reruns, "mismatches": mismatches,
            "same_controller": same_controllers}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="killed runs per command")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    parser.add_argument("--trials", type=int, default=300, help="calibration search trials")
    parser.add_argument("--only", choices=("collect", "calibrate"), default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    results = {}
    with tempfile.TemporaryDirectory(prefix="rift-ada-faults-") as folder:
        work = Path(folder)
        if args.only in (None, "collect"):
            (work / "collect").mkdir()
            results["collect"] = collection_trial(work / "collect", args.runs, rng)
        if args.only in (None, "calibrate"):
            (work / "calibrate").mkdir()
            results["calibrate"] = calibration_trial(work / "calibrate", args.runs, rng, args.trials)
    print(json.dumps({"seed": args.seed, **results}, indent=2))
    return 1 if any(result["mismatches"] for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
