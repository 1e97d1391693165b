"""Fault injection: preempt (SIGTERM, a grace period, then SIGKILL) and fill the disk under real CLI runs.

For each stage (targets, collect, calibrate, bench, train, train-eval) an uninterrupted reference run
is made first. Then, per stage:

- ``--runs`` preempted runs: SIGTERM at a seeded random time of the reference's duration (so across
  its stages), SIGKILL if the process still lives after ``--grace`` seconds; rerun into the same
  directory until it exits 0;
- ``--disk-runs`` full-disk runs (as root: a tmpfs per run, sized to a seeded random share of the
  reference's disk use, so the disk fills at a random point): the run must exit 1 with one
  ``error: <path>: disk is full ...; set by --out`` line naming a path under the run directory and no
  traceback; the tmpfs is then grown (``mount -o remount``) and the run repeated until it exits 0.

Every finished run is compared with the reference (``compare_*`` below says what must be equal and
which fields are left out, and why). A mismatch, a traceback on stderr, or a full-disk message that
does not name the path counts against the run; the script exits 1 if any does.

    nice -n 10 .venv/bin/python benchmarks/fault_injection.py --seed 0          # every stage (~20 min, 2 cores)
    .venv/bin/python benchmarks/fault_injection.py --quick                      # targets only, ~1 min (a test)
    .venv/bin/python benchmarks/fault_injection.py --only bench --runs 4 --disk-runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

CLI = [sys.executable, "-m", "rift_ada.cli.app"]
STAGES = ("targets", "collect", "calibrate", "bench", "train", "train-eval")
PROMPTS = [
    "Explain, step by step, how a hash table resolves collisions with open addressing.",
    "List the planets of the solar system in order and give one fact about each.",
    "Describe how to make bread from flour, water, salt and yeast, one stage at a time.",
    "Walk through binary search on a sorted list of ten numbers, showing each comparison.",
    "Summarise the rules of chess for a beginner: the pieces, how they move, and how to win.",
    "Explain what a compiler does, phase by phase, from source text to machine code.",
]
DISK_FULL = re.compile(
    r"^error: (?P<path>.+): disk is full \(no space left on device\)(; set by (?P<option>--[a-z-]+))?$"
)


@dataclass
class Run:
    """One CLI process: exit code, how it ended, its stderr (from a file: no pipe to fill)."""

    code: int
    seconds: float
    stderr: str
    terminated: bool = False  # SIGTERM sent
    killed: bool = False  # still alive after the grace period: SIGKILL sent

    @property
    def stage(self) -> str:
        """The last progress stage the process reported (where a fault landed)."""
        stages = re.findall(r"^\[([^\]]+)\]", self.stderr, flags=re.MULTILINE)
        return stages[-1] if stages else "start-up"


def run_cli(arguments: list[str], *, term_after: float | None = None, grace: float = 5.0) -> Run:
    """Run ``rift-ada ARGUMENTS``; with ``term_after``: SIGTERM then, SIGKILL ``grace`` seconds later if alive."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        process = subprocess.Popen([*CLI, *arguments], stdout=subprocess.DEVNULL, stderr=log, env=env)
        terminated = killed = False
        if term_after is not None:
            try:
                process.wait(timeout=term_after)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGTERM)
                terminated = True
                try:
                    process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    process.send_signal(signal.SIGKILL)
                    killed = True
        process.wait()
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    return Run(process.returncode, time.monotonic() - started, stderr, terminated, killed)


@dataclass
class Tally:
    """A stage's figures (the table in docs/reliability.md)."""

    runs: int = 0
    faults: int = 0  # SIGTERMs delivered (the process was still running)
    sigkills: int = 0  # of those, still alive after the grace period
    disk_runs: int = 0
    disk_full: int = 0  # runs that met the full disk (the rest finished within the space)
    reruns: int = 0
    mismatches: int = 0
    tracebacks: int = 0
    unnamed: int = 0  # full-disk exits without the one line naming a path under the run directory
    stages_hit: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def finish(arguments: list[str], tally: Tally, limit: int = 4) -> Run:
    """Rerun until exit 0 (at most ``limit`` times)."""
    for _ in range(limit):
        tally.reruns += 1
        run = run_cli(arguments)
        check_traceback(run, tally)
        if run.code == 0:
            return run
        tally.notes.append(f"rerun exited {run.code}: {run.stderr.strip().splitlines()[-1:]}")
    raise RuntimeError(f"rerun keeps failing: {' '.join(arguments)}")


def check_traceback(run: Run, tally: Tally) -> None:
    if "Traceback" in run.stderr:
        tally.tracebacks += 1
        tally.notes.append("traceback: " + run.stderr[run.stderr.index("Traceback") :][:600])


def disk_usage(folder: Path) -> int:
    """Bytes ``folder`` takes on a disk: allocated blocks (a tmpfs counts whole pages), folders included."""
    return sum(p.stat().st_blocks * 512 if p.is_file() else 4096 for p in folder.rglob("*"))


class Tmpfs:
    """A tmpfs mounted on ``folder`` (needs root); ``grow`` makes room without unmounting."""

    def __init__(self, folder: Path, size: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            raise PermissionError(done.stderr.decode(errors="replace").strip() or "mount failed")

    def grow(self, size: int = 4 << 30) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.folder)], check=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


# ----------------------------------------------------------------------------------------------
# What must be equal. Paths are compared with the run directory replaced by <out>.


def _normalised(value, out: Path, drop: frozenset[str]):
    if isinstance(value, dict):
        return {k: _normalised(v, out, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_normalised(v, out, drop) for v in value]
    if isinstance(value, str):
        return value.replace(str(out.resolve()), "<out>").replace(str(out), "<out>")
    return value


def _json(path: Path, out: Path, drop: frozenset[str] = frozenset()) -> object:
    return _normalised(json.loads(path.read_text()), out, drop)


def _text(path: Path, out: Path) -> str:
    text = path.read_text().replace(str(out.resolve()), "<out>").replace(str(out), "<out>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "<created>", text)
    return re.sub(r"\b\d+(\.\d+)? s\b", "<wall> s", text)


# Wall times, timestamps and the command line differ between any two runs, interrupted or not; so do the
# hashes of a trace manifest (it records its creation time, the run's paths and command line).
TIMES = frozenset({"created", "wall_s", "timings", "seconds", "seconds_this_session", "command", "command_line",
                   "timings_total", "wall_total_s", "invocations", "untimed_before"})  # bench.json: per run, summed
HASHES = frozenset({"manifest_hash", "manifest_json_sha256"})
# Optuna's trial numbers: a trial failed by a fault keeps its number and its re-run takes a new one, so the same
# trial (same slot label, parameters and values) has a larger number after a fault.
TRIAL_NUMBERS = frozenset({"number"})
# The commit the run's code came from: it differs when the tree was committed to between the reference and a rerun.
SOURCE = frozenset({"source_commit"})


def compare_targets(out: Path, reference: Path) -> list[str]:
    from rift_ada.collectors.targets.files import read_targets

    return [] if read_targets(out / "targets.parquet") == read_targets(reference / "targets.parquet") else ["rows"]


def compare_collect(out: Path, reference: Path) -> list[str]:
    from rift_ada.collectors.trace_io import read_tables

    tables, expected = read_tables(out / "traces"), read_tables(reference / "traces")
    if tables.keys() != expected.keys():
        return ["table kinds"]
    return [kind for kind in expected if not tables[kind].equals(expected[kind])]


def study_summary(run_dir: Path) -> dict[str, object]:
    import optuna
    from optuna.trial import TrialState

    from rift_ada.calibrate.study import BASELINE_ATTR, open_storage

    storage = open_storage(f"sqlite:///{run_dir / 'study.db'}")
    names = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
    trials = optuna.load_study(study_name=names[0], storage=storage).get_trials(deepcopy=False) if names else []
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    summary = {
        "complete": len(complete),
        "running_or_waiting": sum(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials),
        "baselines": sorted(
            (t.user_attrs[BASELINE_ATTR], tuple(t.values)) for t in complete if t.user_attrs.get(BASELINE_ATTR)
        ),  # fmt: skip
    }
    storage.engine.dispose()
    return summary


def compare_calibrate(out: Path, reference: Path) -> list[str]:
    """The study's invariants (the asked COMPLETE trials, none left RUNNING or WAITING, every baseline once
    with the reference's values) and the controller itself (a rerun samples the uninterrupted run's trials:
    calibrate/study.py's slot-seeded sampler), without its timestamps."""
    from rift_ada.controller import Controller

    got, expected = study_summary(out), study_summary(reference)
    problems = [key for key in ("complete", "baselines") if got[key] != expected[key]]
    problems += ["running/waiting trials left"] if got["running_or_waiting"] else []
    Controller.from_dict(json.loads((out / "controller.json").read_text()))
    drop = TIMES | TRIAL_NUMBERS
    if _json(out / "controller.json", out, drop) != _json(reference / "controller.json", reference, drop):
        problems.append("controller.json")
    return problems


def compare_bench(out: Path, reference: Path) -> list[str]:
    """bench.json, report.md and every exported controller, without wall times, timestamps and the command
    (the cells' and the run's ``timings``/``wall_s`` are per session: a resumed run times only what it ran),
    and without the controllers' trace-manifest hashes (of a manifest holding its creation time and paths)."""
    problems, drop = [], TIMES | TRIAL_NUMBERS | SOURCE
    if _json(out / "bench.json", out, drop) != _json(reference / "bench.json", reference, drop):
        problems.append("bench.json")
    if _text(out / "report.md", out) != _text(reference / "report.md", reference):
        problems.append("report.md")
    names = sorted(p.name for p in (reference / "exported").glob("*.json"))
    if sorted(p.name for p in (out / "exported").glob("*.json")) != names:
        problems.append("exported controller names")
    drop |= HASHES
    for name in names:
        if _json(out / "exported" / name, out, drop) != _json(reference / "exported" / name, reference, drop):
            problems.append(f"exported/{name}")
    return problems


def compare_train(out: Path, reference: Path) -> list[str]:
    """The saved draft's weights (bit for bit), the log's losses per step, and train.json without
    ``resumed_at`` (the step the last session started from) and the session's wall time."""
    import torch
    from safetensors.torch import load_file

    problems = []
    weights, expected = (load_file(str(d / "model" / "model.safetensors")) for d in (out, reference))
    if weights.keys() != expected.keys() or any(not torch.equal(weights[k], expected[k]) for k in expected):
        problems.append("model weights")

    def losses(folder: Path) -> list[tuple[int, float]]:
        lines = (folder / "train-log.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines)]

    if losses(out) != losses(reference):
        problems.append("train-log.jsonl losses")
    drop = TIMES | {"resumed_at"}
    if _json(out / "train.json", out, drop) != _json(reference / "train.json", reference, drop):
        problems.append("train.json")
    return problems


def compare_train_eval(out: Path, reference: Path) -> list[str]:
    problems = []
    if _json(out / "eval.json", out, TIMES) != _json(reference / "eval.json", reference, TIMES):
        problems.append("eval.json")
    if _text(out / "eval.md", out) != _text(reference / "eval.md", reference):
        problems.append("eval.md")
    return problems


# ----------------------------------------------------------------------------------------------
# The stages: the command for a run directory, and what to compare


@dataclass
class Stage:
    name: str
    command: Callable[[Path], list[str]]
    compare: Callable[[Path, Path], list[str]]


TRAIN = ["--dataset", "embedded", "--n-requests", "6", "--isl-buckets", "256", "--rollout-tokens", "16",
         "--max-length", "400", "--steps", "6", "--batch-size", "1", "--lora-rank", "2", "--lr", "1e-2",
         "--checkpoint-every", "1"]  # fmt: skip


def make_stages(work: Path, quick: bool, model: Path | None = None) -> tuple[dict[str, Stage], dict]:
    from rift_ada.collectors.synthetic import synthetic_traces
    from rift_ada.collectors.trace_io import write_probe_traces
    from rift_ada.models import save_tiny_random_llama

    model = model or str(save_tiny_random_llama(work / "model"))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(PROMPTS)))
    n_prompts, tokens = ("2", "16") if quick else ("6", "64")
    data = ["--model", str(model), "--dataset", f"jsonl:{prompts}", "--limit", n_prompts]
    targets = work / "fixed-targets.parquet"
    synthetic_model = work / "synthetic-model"
    synthetic_model.mkdir()
    traces = synthetic_traces(16, 512, seed=7, segment_length=128)
    probe = write_probe_traces(
        work / "probe",
        traces,
        dict(traces.manifest, draft=str(synthetic_model), target=str(synthetic_model), dataset="synthetic", seed=0),
    )
    trained = work / "trained"
    return {
        "targets": Stage(
            "targets",
            lambda out: ["targets", *data, "--temp", "1", "--seed", "5", "--max-new-tokens", tokens,
                         "--out", str(out / "targets.parquet")],  # fmt: skip
            compare_targets,
        ),
        "collect": Stage(
            "collect",
            lambda out: ["collect", *data, "--budget", "64", "--arm-ages", "0,16,32", "--targets", str(targets),
                         "--max-new-tokens", tokens, "--out", str(out / "traces")],  # fmt: skip
            compare_collect,
        ),
        "calibrate": Stage(
            "calibrate",
            lambda out: ["calibrate", "-m", str(synthetic_model), "-t", "0", "--traces", str(probe),
                         "--out", str(out), "--trials", "120", "--seed", "3"],  # fmt: skip
            compare_calibrate,
        ),
        "bench": Stage(
            "bench",
            lambda out: ["bench", "--size", "tiny", "--model", str(model), "--out", str(out), "--temperatures", "0",
                         "--budgets", "96", "--trials", "8", "--table-requests", "0",
                         "--export-controllers", str(out / "exported")],  # fmt: skip
            compare_bench,
        ),
        "train": Stage(
            "train",
            lambda out: ["train", "--model", str(model), "--out", str(out), *TRAIN],
            compare_train,
        ),
        "train-eval": Stage(
            "train-eval",
            lambda out: ["train-eval", "--run", str(trained), "--out", str(out), "--budgets", "96",
                         "--dyn-interval", "4", "--max-new-tokens", "16"],  # fmt: skip
            compare_train_eval,
        ),
    }, {"targets": (targets, data, tokens), "trained": trained, "model": model}


def prepare_inputs(stages: set[str], inputs: dict) -> None:
    """Inputs some stages read (made once, uninterrupted): fixed targets for collect, a trained run for train-eval."""
    targets, data, tokens = inputs["targets"]
    if "collect" in stages and run_cli(["targets", *data, "--max-new-tokens", tokens, "--out", str(targets)]).code:
        raise RuntimeError("fixed targets failed")
    if "train-eval" in stages:
        done = run_cli(["train", "--model", str(inputs["model"]), "--out", str(inputs["trained"]), *TRAIN])
        if done.code:
            raise RuntimeError("training for train-eval failed:\n" + done.stderr[-2000:])


def disk_full_line(run: Run, under: Path) -> bool:
    """The one error line names a path under ``under`` and says the disk is full (``--out`` set it)."""
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    if len(errors) != 1 or not run.stderr.rstrip().endswith(errors[0]):
        return False
    match = DISK_FULL.match(errors[0])
    return bool(match) and Path(match["path"]).resolve().is_relative_to(under.resolve()) and bool(match["option"])


def keep_mismatch(keep: Path | None, out: Path, reference: Path) -> None:
    """Copy a mismatching run and its reference under ``keep`` (the work folder is removed at the end)."""
    if keep is None:
        return
    for folder in (reference, out):
        target = keep / (folder.name if folder.name != "run" else folder.parent.name)
        if not target.exists():
            shutil.copytree(folder, target, ignore=shutil.ignore_patterns("*.safetensors"))


def trial(
    stage: Stage, work: Path, runs: int, disk_runs: int, grace: float, rng: np.random.Generator,
    keep: Path | None = None,
) -> Tally:  # fmt: skip
    tally = Tally()
    reference = work / f"{stage.name}-reference"
    done = run_cli(stage.command(reference))
    if done.code != 0:
        raise RuntimeError(f"{stage.name} reference failed:\n{done.stderr[-3000:]}")
    check_traceback(done, tally)
    duration, usage = done.seconds, disk_usage(reference)
    for index in range(runs):
        out = work / f"{stage.name}-{index}"
        term_after = float(rng.uniform(0.15, 0.95) * duration)
        run = run_cli(stage.command(out), term_after=term_after, grace=grace)
        check_traceback(run, tally)
        tally.runs += 1
        if run.terminated:
            tally.faults += 1
            tally.sigkills += run.killed
            tally.stages_hit.append(f"SIGTERM@{term_after:.0f}s:{run.stage}")
            finish(stage.command(out), tally)
        problems = stage.compare(out, reference)
        tally.mismatches += bool(problems)
        if problems:
            keep_mismatch(keep, out, reference)
        print(f"{stage.name} run {index}: SIGTERM at {term_after:.1f}s of {duration:.1f}s "
              f"(delivered={run.terminated}, SIGKILL={run.killed}, in '{run.stage}'), "
              f"mismatches={problems or 'none'}", flush=True)  # fmt: skip
    for index in range(disk_runs):
        size = max(16 * 1024, int(rng.uniform(0.05, 0.95) * usage))
        mount = work / f"{stage.name}-disk-{index}"
        try:
            disk = Tmpfs(mount, size)
        except PermissionError as error:
            tally.notes.append(f"no tmpfs ({error}): full-disk runs skipped")
            break
        try:
            out = mount / "run"
            tally.disk_runs += 1
            run = run_cli(stage.command(out))
            check_traceback(run, tally)
            if run.code != 0:
                tally.disk_full += 1
                named = disk_full_line(run, mount)
                tally.unnamed += not named
                last = run.stderr.strip().splitlines()[-1:] if run.stderr.strip() else []
                tally.stages_hit.append(f"disk {size // 1024} KiB:{run.stage}")
                if not named:
                    tally.notes.append(f"full disk not named: {last}")
                disk.grow()
                finish(stage.command(out), tally)
            problems = stage.compare(out, reference)
            tally.mismatches += bool(problems)
            if problems:
                keep_mismatch(keep, out, reference)
            print(f"{stage.name} disk run {index}: {size // 1024} KiB of {usage // 1024} KiB used by the reference, "
                  f"full={run.code != 0} (in '{run.stage}'): {run.stderr.strip().splitlines()[-1:]}, "
                  f"mismatches={problems or 'none'}", flush=True)  # fmt: skip
        finally:
            disk.close()
            shutil.rmtree(mount, ignore_errors=True)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="preempted runs per stage")
    parser.add_argument("--disk-runs", type=int, default=2, help="full-disk runs per stage (needs root for tmpfs)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault times and disk sizes")
    parser.add_argument("--only", choices=STAGES, action="append", help="stage(s) to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="targets only, 1 preempted + 1 full-disk run (a test)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--model", type=Path, default=None, help="a local model directory (default: a tiny llama)")
    parser.add_argument("--keep", type=Path, default=None, help="copy every mismatching run and its reference here")
    args = parser.parse_args(argv)
    if args.quick:
        args.only, args.runs, args.disk_runs = ["targets"], 1, 1
    chosen = [s for s in STAGES if args.only is None or s in args.only]
    rng = np.random.default_rng(args.seed)
    results: dict[str, dict] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rift-ada-faults-") as folder:
        work = Path(folder)
        stages, inputs = make_stages(work, args.quick, args.model)
        prepare_inputs(set(chosen), inputs)
        for name in chosen:
            began = time.monotonic()
            tally = trial(stages[name], work, args.runs, args.disk_runs, args.grace, rng, args.keep)
            results[name] = asdict(tally) | {"wall_s": round(time.monotonic() - began, 1)}
            if args.json is not None:  # after every stage: a long run's finished stages are kept
                args.json.write_text(json.dumps({"seed": args.seed, "stages": results}, indent=2) + "\n")
    summary = {"seed": args.seed, "grace_s": args.grace, "wall_s": round(time.monotonic() - started, 1),
               "stages": results}  # fmt: skip
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    bad = sum(r["mismatches"] + r["tracebacks"] + r["unnamed"] for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
