"""`rift-ada bench`: the benchmark that confirms or refutes the paper's headline on one model.

Per temperature: target responses (once, shared by every budget). Per (temperature, budget) cell:
probe traces -> calibration (Optuna over replay, splits calibration / selection / confirmation)
-> the closed loop on the confirmation split: the calibrated controller, the periodic reference,
periodic refresh at the controller's own rate (the CI'd comparisons, :mod:`rift_ada.experiments.confirm`)
and every Table 1 method -> replay fidelity, staleness curve, the hindsight oracle's frontier and
the share of its refresh saving the controller captures. ``bench.json`` holds every figure;
``report.md`` is rendered from it alone (:mod:`rift_ada.experiments.bench_report`).

Resumable: targets, probe and closed-loop runs continue from their committed parts; a finished
cell is kept in ``<cell>/cell.json`` and read back; an unfinished calibration starts over (it is
seeded, so it gives what an uninterrupted run gives). Re-running after an interruption therefore
writes the same report.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.atomic import atomic_write_json, json_safe
from rift_ada.calibrate.closed_loop import attach_closed_confirmation
from rift_ada.calibrate.config import CalibrationConfig
from rift_ada.calibrate.curve import curve_intervals, preregister
from rift_ada.calibrate.pipeline import calibrate
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.collectors.probe_traces import DEFAULT_ARM_AGES
from rift_ada.experiments.bench_report import other_thread_counts, write_bench_report
from rift_ada.experiments.confirm import confirm_closed
from rift_ada.experiments.evaluation import evaluate_run
from rift_ada.memory import release_free_heap
from rift_ada.policy_spec import periodic_label
from rift_ada.scorers.registry import SCORER_NAMES
from rift_ada.throughput import CLOSED_BATCH, PROBE_BATCH

Progress = Callable[[str, int, int | None], None]
# ``stage -> on_tokens(tokens, rounds)``: tokens committed as a long stage runs (the CLI's ``tokens_callback``)
TokenProgress = Callable[[str], Callable[[int, int], None]]

BENCH_FORMAT = "rift-ada.bench"
BENCH_VERSION = 1
ORACLE_MIN_AGE = 32  # the controller schedule's default min_age
SNAPKV_OBS_WINDOW = 64  # CollectSettings.obs_window: the Table 1 SnapKV baseline needs budget > this

# Table 1 methods besides RIFT-dyn (periodic at each of ``table_intervals``) and RIFT-ada.
TABLE_BASELINES: tuple[tuple[str, str], ...] = (
    ("SWA", "swa"),
    ("StreamingLLM", "streamingllm"),
    ("H2O", "h2o"),
    ("TriAttention", "triattention"),  # decode-time: rescored every 128 tokens (collectors.collect)
    ("SnapKV", "snapkv"),
    ("RIFT-stat", "stat"),
    ("Full KV", "full"),
)


@dataclass(frozen=True)
class BenchSize:
    """How big a benchmark run is: ``full`` (36 requests x 768 tokens, 3 budgets, T = 0 and 1), ``small``
    (`make demo`), ``tiny`` (the test suite)."""

    n_requests: int
    output_tokens: int
    budgets: tuple[int, ...]
    temperatures: tuple[float, ...]
    trials: int
    reference_interval: int = 64
    table_intervals: tuple[int, ...] = (16, 64, 128)
    arm_ages: tuple[int, ...] = DEFAULT_ARM_AGES
    max_age: int = 768
    min_isl: int = 900
    max_isl: int = 2048
    split: tuple[float, float, float] = (0.34, 0.33, 0.33)
    table_requests: int | None = None  # confirmation requests that run every Table 1 method (None: all)
    batch_size: int = CLOSED_BATCH  # requests per batched forward of the targets and the closed loop
    probe_batch_size: int = PROBE_BATCH  # requests stacked in one probe forward (each holds every arm's KV history)
    # T > 0 closed loop: real rejection sampling (each policy its own text) instead of teacher forcing
    # every policy on the target responses (the same law given the text; docs/calibration.md, 5b)
    free_running: bool = False
    # Targets end at EOS or at output_tokens (False), or are forced to output_tokens with EOS suppressed (True:
    # the workload before 2026-12-01, whose greedy SmolLM2 responses loop past their natural end)
    forced_length: bool = False
    # Looping targets (collectors/loops.py): share of repeated loop_ngram-grams >= loop_threshold; "exclude" leaves
    # them out of every cell of their temperature, "keep" runs them (both report them in bench.json). Greedy
    # SmolLM2 loops on most embedded prompts (docs/workload.md), so excluding them would leave no T = 0 cell.
    loop_ngram: int = 4
    loop_threshold: float = 0.3
    loop_rule: str = "keep"
    # Confirmation-only requests added to the split's (closed loop only: never probed, never calibrated on).
    # Raising it extends a finished run: every finished stage is read back, only the new requests run.
    confirm_extra: int = 0
    # Operating point: the largest AL gain over the selection split's periodic curve; trials within this
    # margin (AL) of the best count as tied and the fewest-refresh one is taken (the winner's curse).
    selection_margin: float = 0.02
    n_resamples: int = 4999  # the curve's paired bootstrap
    scorer: str = "snapkv"  # prefill scorer of SnapKV / RIFT-stat / RIFT-dyn / RIFT-ada (rift_ada.scorers.registry)

    def check(self) -> None:
        """Refuse an inconsistent size before any model loads (errors name the field)."""
        problems = []
        if self.n_requests < 6:
            problems.append(f"n_requests: need >= 6 (three splits of >= 2), got {self.n_requests}")
        if self.output_tokens < 16:
            problems.append(f"output_tokens: need >= 16, got {self.output_tokens}")
        if not self.budgets or min(self.budgets) <= SNAPKV_OBS_WINDOW:
            problems.append(
                f"budgets: need budgets > the SnapKV observation window ({SNAPKV_OBS_WINDOW}), got {list(self.budgets)}"
            )
        if len(set(self.budgets)) != len(self.budgets):
            problems.append(f"budgets: duplicates in {list(self.budgets)}")
        if not self.temperatures or min(self.temperatures) < 0:
            problems.append(f"temperatures: need at least one temperature >= 0, got {list(self.temperatures)}")
        if self.trials < 0:
            problems.append(f"trials: must be >= 0, got {self.trials}")
        if self.scorer not in SCORER_NAMES:
            problems.append(f"scorer: unknown scorer {self.scorer!r} (one of {', '.join(SCORER_NAMES)})")
        oldest = max(self.arm_ages, default=0)
        for name, age in [("max_age", self.max_age), ("reference_interval", self.reference_interval)] + [
            (f"table_intervals[{i}]", interval) for i, interval in enumerate(self.table_intervals)
        ]:
            if min(age, self.output_tokens - 1) > oldest:
                problems.append(f"{name}: {age} is beyond the oldest probe arm ({oldest}); add an arm or lower it")
        if any(age % 8 for age in self.arm_ages):
            problems.append(f"arm_ages: must be multiples of the decision stride 8, got {list(self.arm_ages)}")
        if self.table_requests is not None and self.table_requests < 0:
            problems.append(f"table_requests: must be >= 0 (0: no Table 1 methods) or None, got {self.table_requests}")
        if self.batch_size < 1:
            problems.append(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.probe_batch_size < 1:
            problems.append(f"probe_batch_size: must be >= 1, got {self.probe_batch_size}")
        if self.confirm_extra < 0:
            problems.append(f"confirm_extra: must be >= 0, got {self.confirm_extra}")
        if self.selection_margin < 0:
            problems.append(f"selection_margin: must be >= 0, got {self.selection_margin}")
        if self.n_resamples < 100:
            problems.append(f"n_resamples: need >= 100, got {self.n_resamples}")
        if self.min_isl > self.max_isl:
            problems.append(f"min_isl ({self.min_isl}) > max_isl ({self.max_isl})")
        try:
            self.loop_detector()
        except ValueError as error:
            problems.append(str(error))
        if problems:
            raise CalibrationError("bench size: " + "; ".join(problems))

    def loop_detector(self) -> Any:
        from rift_ada.collectors.loops import LoopDetector

        return LoopDetector(n=self.loop_ngram, threshold=self.loop_threshold, rule=self.loop_rule)  # type: ignore[arg-type]


BENCH_SIZES: dict[str, BenchSize] = {
    "tiny": BenchSize(
        n_requests=6,
        output_tokens=40,
        budgets=(96, 160),
        temperatures=(0.0, 1.0),
        trials=8,
        reference_interval=16,
        table_intervals=(16,),
        arm_ages=(0, 8, 16, 32, 48),
        max_age=48,
        min_isl=0,
        max_isl=1100,
        table_requests=1,
    ),
    # `make demo`: the cell with the most pre-check headroom on SmolLM2 (docs/notes/2026-12-01-workload-precheck.md):
    # T = 1, teacher-forced closed loop, B = 128 at ISL ~1K; every Table 1 method on 1 confirmation request. Outputs
    # of up to 192 tokens (256 before) keep it near 20 min on 2 cores (docs/performance.md, "Demo and benchmark").
    "small": BenchSize(
        n_requests=12,
        output_tokens=192,
        budgets=(128,),
        temperatures=(1.0,),
        trials=120,
        arm_ages=(0, 8, 16, 32, 64, 128, 256),
        max_age=256,
        max_isl=1100,
        split=(0.25, 0.25, 0.5),
        table_requests=1,
    ),
    "full": BenchSize(n_requests=36, output_tokens=768, budgets=(128, 256, 512), temperatures=(0.0, 1.0), trials=300),
}


def bench_size(name: str, **overrides: Any) -> BenchSize:
    """A named size with some fields replaced (``None`` values are ignored), checked."""
    if name not in BENCH_SIZES:
        raise CalibrationError(f"size: unknown bench size {name!r} (one of {sorted(BENCH_SIZES)})")
    size = replace(BENCH_SIZES[name], **{key: value for key, value in overrides.items() if value is not None})
    size.check()
    return size


@dataclass
class _Stages:
    """Progress of a bench: every stage line goes to ``progress`` (and so to the log)."""

    progress: Progress
    token_progress: TokenProgress | None = None
    timings: dict[str, float] = field(default_factory=dict)
    ledger: _TimeLedger | None = None  # every invocation's stage times (timings: this invocation's)

    def counter(self, stage: str, total: int) -> Callable[[str, int], None]:
        done = [0]
        self.progress(stage, 0, total)

        def step(request_id: str, n_tokens: int) -> None:
            done[0] += 1
            self.progress(stage, done[0], total)

        return step

    def tokens(self, stage: str) -> Callable[[int, int], None] | None:
        """``on_tokens(tokens, rounds)`` moving ``stage`` (started by :meth:`counter`) as tokens are committed."""
        return None if self.token_progress is None else self.token_progress(stage)

    def token_counter(self, stage: str) -> Callable[[int], None] | None:
        """``on_token(token)`` (target generation): one committed token per call on ``stage``."""
        committed = self.tokens(stage)
        return None if committed is None else lambda token: committed(1, 0)

    def timed(self, stage: str, seconds: float) -> None:
        """Record a finished stage's time, and give the heap it freed back to the system."""
        self.timings[stage] = round(self.timings.get(stage, 0.0) + seconds, 1)
        if self.ledger is not None:
            self.ledger.add(stage, seconds)
        release_free_heap()  # a 32-request loop otherwise keeps ~2 GiB of freed heap (rift_ada/memory.py)


@dataclass
class _TimeLedger:
    """Stage times summed over every invocation of a run (``timings.json``, rewritten as each stage finishes),
    so a run finished by a resumed invocation still reports what its interrupted ones spent."""

    path: Path
    stages: dict[str, float] = field(default_factory=dict)
    invocations: list[dict[str, Any]] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    untimed_before: bool = False  # the run had work from invocations that predate its ledger (not counted)

    @classmethod
    def open(cls, path: Path, commit: str | None = None, threads: int | None = None) -> _TimeLedger:
        """Read the run's ledger and begin this invocation's entry (``commit``: the code it runs; ``threads``: torch's
        thread count it runs at)."""
        ledger = cls(path)
        if path.exists():
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
                ledger.stages = {str(k): float(v) for k, v in stored.get("stages", {}).items()}
                ledger.invocations = [dict(entry) for entry in stored.get("invocations", [])]
                ledger.untimed_before = bool(stored.get("untimed_before", False))
            except (OSError, ValueError, AttributeError, TypeError):
                pass  # unreadable: start a new ledger (times are reported, never used to decide)
        else:  # a run begun before bench kept this ledger: its earlier invocations' times are unknown
            ledger.untimed_before = (path.parent / "bench.json").exists() or any(path.parent.glob("T*/targets*"))
        ledger.invocations.append(
            {
                "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "wall_s": 0.0,
                "commit": commit,
                "threads": threads,
            }
        )
        return ledger

    def other_thread_counts(self) -> list[int]:
        """torch thread counts of earlier invocations other than this one's (unrecorded ones are not counted)."""
        own = self.invocations[-1].get("threads")
        return other_thread_counts(self.invocations[:-1], own)

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = round(self.stages.get(stage, 0.0) + seconds, 1)
        self.write()

    def write(self) -> None:
        """Record this invocation's wall time so far (an interrupted one keeps it up to its last finished stage)."""
        self.invocations[-1]["wall_s"] = round(time.monotonic() - self.began, 1)
        record = {"stages": self.stages, "invocations": self.invocations, "untimed_before": self.untimed_before}
        atomic_write_json(self.path, record)

    @property
    def wall_s(self) -> float:
        return round(sum(float(entry.get("wall_s", 0.0)) for entry in self.invocations), 1)


def select_requests(requests: Sequence[Any], size: BenchSize) -> list[Any]:
    """``size.n_requests`` requests with ISL in [min_isl, max_isl], spread over the dataset's categories."""
    return select_all_requests(requests, size)[0]


def select_all_requests(requests: Sequence[Any], size: BenchSize) -> tuple[list[Any], list[Any]]:
    """The run's requests and its ``confirm_extra`` confirmation-only ones (disjoint; raising ``confirm_extra``
    keeps the earlier extra requests, since the spread takes them in a fixed order)."""
    from rift_ada.collectors.pipeline import spread_requests

    eligible = [request for request in requests if size.min_isl <= request.isl <= size.max_isl]
    wanted = size.n_requests + size.confirm_extra
    if len(eligible) < wanted:
        raise CalibrationError(
            f"n_requests + confirm_extra: the dataset has {len(eligible)} requests with ISL in "
            f"[{size.min_isl}, {size.max_isl}], {wanted} wanted"
        )
    base = spread_requests(eligible, size.n_requests)
    taken = {id(request) for request in base}
    rest = [request for request in eligible if id(request) not in taken]
    return base, spread_requests(rest, size.confirm_extra) if size.confirm_extra else []


_GRID_FIELDS = ("budgets", "temperatures")  # the grid a cell sits in; its own budget and temperature are fields
_EXTENSION_FIELDS = ("confirm_extra",)  # a finished cell is extended, not redone, when only these change
# How the work is batched, not what it computes (a batch gives the results of its requests run alone): a cell
# finished at one batch size is read back, or extended, at another.
_EXECUTION_FIELDS = ("batch_size", "probe_batch_size")


def _cell_fingerprint(size: BenchSize, temperature: float, budget: int, seed: int, model: str, dataset: str) -> dict:
    """What a finished cell depends on (adding a budget or a temperature to the grid leaves it done)."""
    skipped = _GRID_FIELDS + _EXTENSION_FIELDS + _EXECUTION_FIELDS
    fields = {name: value for name, value in asdict(size).items() if name not in skipped}
    if temperature <= 0:  # teacher-forced at T = 0 either way
        del fields["free_running"]
    if fields["scorer"] == "snapkv":  # cells written before scorers were selectable match
        del fields["scorer"]
    return {
        "size": fields,
        "temperature": temperature,
        "budget": budget,
        "seed": seed,
        "model": model,
        "dataset": dataset,
    }


def same_cell(stored: Any, fingerprint: dict) -> bool:
    """Whether a finished cell's stored fingerprint is ``fingerprint`` (cells written before
    2026-12-01 also recorded the whole grid, which is ignored)."""
    if not isinstance(stored, dict) or not isinstance(stored.get("size"), dict):
        return False
    skipped = _GRID_FIELDS + _EXTENSION_FIELDS + _EXECUTION_FIELDS
    size = {name: value for name, value in stored["size"].items() if name not in skipped}
    size.setdefault("forced_length", True)  # cells written before these fields forced their targets and kept loops
    for name, value in (("loop_ngram", 4), ("loop_threshold", 0.3), ("loop_rule", "keep")):
        size.setdefault(name, value)
    return {**stored, "size": size} == fingerprint


def _table_specs(size: BenchSize) -> list[str]:
    specs = [spec for _, spec in TABLE_BASELINES]
    return specs + [periodic_label(interval) for interval in size.table_intervals]


def _closed_rows(
    totals: dict[str, dict[str, np.ndarray]], request_ids: Sequence[str], full_label: str = "full"
) -> dict[str, dict[str, Any]]:
    """Per policy: macro AL, % of full KV and refreshes / 1K over ``request_ids`` (the same set for all)."""
    rows: dict[str, dict[str, Any]] = {}
    wanted = sorted(request_ids)
    for label, data in totals.items():
        index = {str(rid): i for i, rid in enumerate(data["request_id"])}
        if any(rid not in index for rid in wanted):
            continue
        picked = [index[rid] for rid in wanted]
        committed = float(np.sum(data["committed"][picked]))
        rows[label] = {
            "mean_al": float(np.mean(data["al"][picked])),
            "refreshes_per_1k": 1000.0 * float(np.sum(data["refreshes"][picked])) / committed if committed else None,
            "n_requests": len(picked),
            "per_request_al": [float(x) for x in data["al"][picked]],
        }
    full = rows.get(full_label)
    for row in rows.values():
        row["pct_of_full"] = row["mean_al"] / full["mean_al"] if full and full["mean_al"] else None
    return rows


def _staleness(by_position: dict[str, Any]) -> dict[str, Any]:
    """How much the workload went stale: closed-loop stat vs full AL early and late in the output (the AL
    headroom refreshing can buy is read off the closed-loop curve instead: stat vs the densest periodic Δ)."""
    curves = by_position["curves"]

    def quarter_means(values: list[float | None]) -> tuple[float | None, float | None]:
        known = [v for v in values if v is not None]
        if len(known) < 4:
            return None, None
        quarter = max(1, len(known) // 4)
        return float(np.mean(known[:quarter])), float(np.mean(known[-quarter:]))

    out: dict[str, Any] = {}
    for label in ("stat", "full"):
        if label in curves:
            first, last = quarter_means(curves[label])
            out[label] = {"first_quarter_al": first, "last_quarter_al": last}
    stat, full = out.get("stat"), out.get("full")
    if stat and full and None not in (stat["first_quarter_al"], stat["last_quarter_al"], full["last_quarter_al"]):
        out["stat_share_of_full_first"] = stat["first_quarter_al"] / full["first_quarter_al"]
        out["stat_share_of_full_last"] = stat["last_quarter_al"] / full["last_quarter_al"]
    return out


def _oracle(traces: Any, request_ids: Sequence[str], size: BenchSize, replay_rows: list[dict], ctl: str) -> dict:
    """The hindsight oracle's frontier on the confirmation requests and the controller's captured share (replay)."""
    from rift_ada.policies.oracle import captured_share, oracle_frontier

    ids = set(request_ids)
    keep = np.array([i for i, rid in enumerate(traces.requests["request_id"]) if str(rid) in ids])
    started = time.monotonic()
    # The oracle may refresh as early as the reference does, so it bounds the reference and the controller.
    min_age = min(ORACLE_MIN_AGE, size.reference_interval)
    frontier = oracle_frontier(traces, min_age=min_age, max_age=size.max_age, requests=keep)
    by_policy = {row["policy"]: row for row in replay_rows}
    reference = by_policy.get(periodic_label(size.reference_interval))
    controller = by_policy.get(ctl)
    share = None
    oracle_at_reference = None
    if reference is not None and controller is not None:
        oracle_at_reference = frontier.refreshes_for(reference["mean_al"])
        share = captured_share(
            frontier, reference["mean_al"], reference["refreshes_per_1k"], controller["refreshes_per_1k"]
        )
    return {
        "frontier": frontier.to_dict(),
        "reference": None
        if reference is None
        else {k: reference[k] for k in ("policy", "mean_al", "refreshes_per_1k")},
        "controller": None
        if controller is None
        else {k: controller[k] for k in ("policy", "mean_al", "refreshes_per_1k")},
        "oracle_refreshes_per_1k_at_reference_al": None
        if oracle_at_reference is None or not np.isfinite(oracle_at_reference)
        else float(oracle_at_reference),
        "captured_share": None if share is None or not np.isfinite(share) else float(share),
        "min_age": min_age,
        "seconds": round(time.monotonic() - started, 1),
    }


def _signal_summary(calibration: dict[str, Any], controller: dict[str, Any]) -> dict[str, Any]:
    """Which signals the chosen controller uses, and how the score fit weighted them."""
    policy = controller.get("policy", {})
    used: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "signal" in node and node["signal"] not in used:
                used.append(str(node["signal"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(policy)
    return {
        "kind": policy.get("kind"),
        "signals_used": used,
        "chosen": calibration["operating_point"].get("chosen", {}).get("label"),
        "chosen_by": calibration["operating_point"].get("chosen_by"),
        "score_terms": [
            {k: term.get(k) for k in ("signal", "weight", "orientation")}
            for term in policy.get("terms", [])
            if isinstance(term, dict)
        ],
    }


def _calibrated(
    folder: Path, probe_dir: Path, traces: Any, *, name: str, pair: Any, size: BenchSize, temperature: float,
    budget: int, seed: int, stages: _Stages, tag: str, signals: Sequence[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Path]:  # fmt: skip
    """Calibrate into ``folder`` (from scratch: a half-done study would not resume to the same trials);
    ``signals`` restricts the search (default: all the traces carry)."""
    from rift_ada.collectors.trace_io import manifest_hash

    if folder.exists():
        shutil.rmtree(folder)

    def calibration_progress(stage: str, done: int, total: int | None) -> None:
        stages.progress(f"{tag} calibrate: {stage}", done, total)

    started = time.monotonic()
    config = CalibrationConfig(
        name=name,
        draft=pair.preset.draft,
        target=pair.preset.target_name,
        temperature=temperature,
        trials=size.trials,
        seed=seed,
        split=size.split,
        reference_interval=size.reference_interval,
        manifest_hash=manifest_hash(probe_dir),
        cache={"budget": budget},
        schedule={"max_age": size.max_age},
        signals=signals,
        objective="curve",
        selection_margin=size.selection_margin,
    )
    result = calibrate(traces, folder, config, progress=calibration_progress, log=None)
    stages.timed(f"{tag} calibrate", time.monotonic() - started)
    return result.calibration, result.controller, result.controller_path


def target_workload(
    targets: Sequence[dict[str, Any]], size: BenchSize, tokenizer: Any, provenance: dict[str, Any]
) -> dict[str, Any]:
    """How a temperature's targets end (EOS or cap), their lengths, and the loop detector's report and rule."""
    eos = getattr(tokenizer, "eos_token_id", None)
    lengths = [len(row["response_token_ids"]) for row in targets]
    report = size.loop_detector().report_rows(targets)
    return {
        "response_end": provenance.get("response_end"),
        "max_new_tokens": provenance.get("max_new_tokens"),
        "n_responses": len(targets),
        "ended_at_eos": sum(1 for row in targets if eos is not None and row["response_token_ids"][-1:] == [eos]),
        "osl": {"min": min(lengths), "mean": float(np.mean(lengths)), "max": max(lengths)} if lengths else None,
        "loops": report.to_dict(),
    }


def cell_settings(pair: Any, size: BenchSize, *, temperature: float, budget: int, seed: int, dataset: str) -> Any:
    """The collection settings of one (temperature, budget) cell (probe and closed loop alike)."""
    from rift_ada.collectors.collect import CollectSettings

    return CollectSettings(
        draft=pair.preset.draft,
        target=pair.preset.target_name,
        temperature=temperature,
        seed=seed,
        budget=budget,
        arm_ages=size.arm_ages,
        dataset=dataset,
        scorer=size.scorer,
    )


def run_cell(
    pair: Any,
    requests: Sequence[Any],
    targets: Sequence[dict[str, Any]],
    folder: Path,
    *,
    size: BenchSize,
    temperature: float,
    budget: int,
    seed: int,
    dataset: str,
    stages: _Stages,
    targets_manifest: dict[str, Any] | None = None,
    extra_requests: Sequence[Any] = (),
    register: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One (temperature, budget) cell: probe, calibrate, closed loop, fidelity, oracle; returns its summary.

    ``targets_manifest``: the targets' provenance (`targets_provenance`: how responses end, ...) for the
    probe manifest. ``extra_requests``: confirmation-only requests (closed loop only). A finished cell with
    fewer of them is extended: its probe and calibration are read back and the closed loop runs only the new
    requests. ``register(tag, preregistration)`` is called before the confirmation's closed loop starts."""
    from rift_ada.collectors.collect import closed_results
    from rift_ada.collectors.pipeline import run_collection
    from rift_ada.collectors.trace_io import read_probe_traces

    tag = f"T{temperature:g} B{budget}"
    fingerprint = json_safe(_cell_fingerprint(size, temperature, budget, seed, pair.preset.name, dataset))
    cell_file = folder / "cell.json"
    extra_ids = [str(request.request_id) for request in extra_requests]
    calibrated_before = False
    if cell_file.exists():
        done = json.loads(cell_file.read_text(encoding="utf-8"))
        if same_cell(done.get("fingerprint"), fingerprint):
            if list(done.get("extra_ids", [])) == extra_ids:
                stages.progress(f"{tag}: done earlier", 1, 1)
                return done
            calibrated_before = True  # the same cell with other confirmation-only requests: extend it
    settings = cell_settings(pair, size, temperature=temperature, budget=budget, seed=seed, dataset=dataset)
    if not calibrated_before:
        started = time.monotonic()
        run_collection(
            pair,
            requests,
            targets,
            folder / "probe",
            settings,
            mode="probe",
            on_request=stages.counter(f"{tag} probe", len(requests)),
            on_tokens=stages.tokens(f"{tag} probe"),
            batch_size=size.probe_batch_size,
            extra_manifest=None if targets_manifest is None else {"targets": targets_manifest},
        )
        stages.timed(f"{tag} probe", time.monotonic() - started)
    traces = read_probe_traces(folder / "probe")
    precheck = cell_precheck(traces, size, seed)  # before calibrating: is there staleness to refresh for?
    model_name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(pair.preset.name).name)  # a path model: its folder name
    name = f"{model_name}-T{temperature:g}-B{budget}"
    if calibrated_before:
        stages.progress(f"{tag} calibrate: done earlier", 1, 1)
        controller_path = folder / "calibration" / "controller.json"
        calibration = json.loads((folder / "calibration" / "calibration.json").read_text(encoding="utf-8"))
        controller = json.loads(controller_path.read_text(encoding="utf-8"))
    else:
        calibration, controller, controller_path = _calibrated(
            folder / "calibration", folder / "probe", traces, name=name, pair=pair, size=size,
            temperature=temperature, budget=budget, seed=seed, stages=stages, tag=tag,
        )  # fmt: skip
    split_ids = sorted(str(rid) for rid in calibration["confirmation"]["request_ids"])
    confirmation_ids = sorted(split_ids + extra_ids)
    by_id = {request.request_id: request for request in [*requests, *extra_requests]}
    # Pre-registered before the closed loop runs: the rule, the paper's effect, the margin, the size, the curve.
    chosen = calibration["operating_point"]["chosen"]
    longest = max(8, min(size.max_age, size.output_tokens // 2))
    curve_specs = ["stat"] + [periodic_label(d) for d in curve_intervals(float(chosen["refreshes_per_1k"]), longest)]
    preregistration = preregister(
        temperature,
        len(confirmation_ids),
        curve_specs,
        selection_margin=size.selection_margin,
        n_resamples=size.n_resamples,
        seed=seed,
        extra={
            "confirmation_split": len(split_ids),
            "confirmation_only": len(extra_ids),
            "controller": str(controller["name"]),
            "selection_rate_per_1k": float(chosen["refreshes_per_1k"]),
        },
    )
    if register is not None:
        register(tag, preregistration.to_dict())
    held_out = [by_id[rid] for rid in confirmation_ids]
    # table_requests: None runs every Table 1 method on every confirmation request, N on the first N, 0 on none.
    table_ids = split_ids[: size.table_requests] if size.table_requests else confirmation_ids
    table_extra = _table_specs(size) if size.table_requests != 0 else []

    started = time.monotonic()
    free_running = size.free_running and temperature > 0
    confirmation = confirm_closed(
        calibration,
        controller,
        draft_model=pair.draft,
        target_model=pair.target,
        requests=held_out,
        targets=targets,
        settings=settings,
        out_dir=folder / "confirm",
        extra_policies=table_extra if table_ids == confirmation_ids else (),
        batch_size=size.batch_size,
        on_request=stages.counter(f"{tag} closed loop: confirmation", len(held_out)),
        on_tokens=stages.tokens(f"{tag} closed loop: confirmation"),
        free_running=free_running,
        preregistration=preregistration,
        extra_requests=extra_ids,
    )
    closed_dirs = [Path(confirmation.run_dir)]
    totals: dict[str, dict[str, np.ndarray]] = dict(closed_results(confirmation.run_dir))
    table_only = [spec for spec in table_extra if spec not in totals]  # e.g. the reference's periodic run
    if table_ids != confirmation_ids and table_only:
        from rift_ada.collectors.collect import collect_closed

        collect_closed(
            pair.draft,
            [by_id[rid] for rid in table_ids],
            targets,
            folder / "table",
            settings,
            table_only,
            target_model=pair.target,
            on_request=stages.counter(f"{tag} closed loop: Table 1 methods", len(table_ids)),
            on_tokens=stages.tokens(f"{tag} closed loop: Table 1 methods"),
            free_running=free_running,
            batch_size=size.batch_size,
        )
        closed_dirs.append(folder / "table")
        for label, data in closed_results(folder / "table").items():
            totals.setdefault(label, data)
    stages.timed(f"{tag} closed loop", time.monotonic() - started)
    calibration = attach_closed_confirmation(folder / "calibration", confirmation)
    table = _closed_rows(totals, table_ids)
    controller_name = str(controller["name"])
    replay_specs = ["stat", "full", *[periodic_label(d) for d in size.table_intervals], str(controller_path)]
    if periodic_label(size.reference_interval) not in replay_specs:
        replay_specs.insert(2, periodic_label(size.reference_interval))
    evaluation = evaluate_run(folder / "probe", replay_specs, closed_dir=confirmation.run_dir)
    held_out_replay = _replay_on(traces, replay_specs, split_ids)
    by_position = closed_by_position(closed_dirs)
    cell = {
        "fingerprint": fingerprint,
        "tag": tag,
        "temperature": temperature,
        "budget": budget,
        "reference": periodic_label(size.reference_interval),
        "controller_name": controller_name,
        "controller_path": str(controller_path),
        "split_sizes": {k: len(v) for k, v in calibration["splits"]["request_ids"].items()}
        if isinstance(calibration["splits"].get("request_ids"), dict)
        else calibration["splits"].get("sizes"),
        "confirmation_ids": confirmation_ids,
        "extra_ids": extra_ids,
        "table_ids": table_ids,
        "preregistration": preregistration.to_dict(),
        "curve": confirmation.curve,
        "selection_vs_confirmation": _selection_vs_confirmation(calibration, confirmation.curve),
        "free_running": free_running,
        "table": table,
        "confirmation": confirmation.to_dict() | {"replay_comparisons": calibration["confirmation"]["comparisons"]},
        "replay_verdict": confirmation.replay_verdict,
        "fidelity": [
            row["fidelity"] | {"policy": row["policy"]} for row in evaluation["policies"] if row.get("fidelity")
        ],
        "replay_held_out": held_out_replay,
        "closed_by_position": by_position,
        "precheck": precheck,
        "staleness": _staleness(by_position),
        "oracle": _oracle(traces, split_ids, size, held_out_replay, controller_name),
        "signals": _signal_summary(calibration, controller),
        "timings": {k: v for k, v in stages.timings.items() if k.startswith(tag)},
    }
    cell = json_safe(cell)
    atomic_write_json(cell_file, cell)
    return json.loads(cell_file.read_text(encoding="utf-8"))  # as a later run reads it back (key order included)


def cell_precheck(traces: Any, size: BenchSize, seed: int) -> dict[str, Any]:
    """The workload pre-check of a cell's probe traces (:mod:`rift_ada.calibrate.precheck`): RIFT-stat,
    periodic refresh at the Table 1 intervals and full KV by output position, and the retained mass."""
    from rift_ada.calibrate.precheck import PreCheck

    intervals = tuple(sorted({*size.table_intervals, size.reference_interval}))
    position_bin = max(8, size.output_tokens // 8 // 8 * 8)  # about 8 bins over the output
    return PreCheck(intervals=intervals, position_bin=position_bin, seed=seed).run(traces)


def _selection_vs_confirmation(calibration: dict[str, Any], curve: dict[str, Any] | None) -> dict[str, Any]:
    """The chosen point's curve gap where it was chosen (replay, selection split) and where it was confirmed."""
    chosen = calibration["operating_point"]["chosen"]
    selection = calibration["operating_point"].get("selection_gap") or {}
    confirmed = (curve or {}).get("gap") or {}
    return {
        "selection": {
            "mean_al": chosen["mean_al"],
            "refreshes_per_1k": chosen["refreshes_per_1k"],
            "al_gain": selection.get("al_gain"),
            "refresh_reduction": selection.get("refresh_reduction"),
            "n_requests": calibration["splits"]["sizes"]["selection"],
        },
        "confirmation": {
            "mean_al": (confirmed.get("controller") or {}).get("mean_al"),
            "refreshes_per_1k": (confirmed.get("controller") or {}).get("refreshes_per_1k"),
            "al_gain": (confirmed.get("al_gain") or {}).get("estimate"),
            "refresh_reduction": (confirmed.get("refresh_reduction") or {}).get("estimate"),
            "n_requests": confirmed.get("n_requests"),
        },
    }


def closed_by_position(closed_dirs: Sequence[Path], bin_size: int = 32) -> dict[str, Any]:
    """Macro AL of rounds starting in each output-position bin, per closed-loop policy (staleness curve).

    A policy found in several runs is read from the first that has it (each over its own requests)."""
    from rift_ada.collectors.trace_io import read_tables

    columns: dict[str, list] = {"policy": [], "request_id": [], "position": [], "al": []}
    seen: set[str] = set()
    for closed_dir in closed_dirs:
        table = read_tables(closed_dir, kinds=["rounds"])["rounds"]
        labels = table.column("policy").to_pylist()
        keep = [i for i, label in enumerate(labels) if label not in seen]
        for name in columns:
            values = table.column(name).to_pylist()
            columns[name] += [values[i] for i in keep]
        seen |= set(labels)
    policy = np.asarray(columns["policy"])
    request = np.asarray(columns["request_id"])
    position = np.asarray(columns["position"])
    al = np.asarray(columns["al"], dtype=float)
    n_bins = int(position.max() // bin_size) + 1 if len(position) else 0
    curves: dict[str, list[float | None]] = {}
    for label in sorted(set(policy.tolist())):
        values = []
        for index in range(n_bins):
            per_request = []
            for rid in sorted(set(request.tolist())):
                mask = (policy == label) & (request == rid) & (position // bin_size == index)
                if mask.any():
                    per_request.append(float(al[mask].mean()))
            values.append(float(np.mean(per_request)) if per_request else None)
        curves[label] = values
    return {"bin_size": bin_size, "curves": curves}


def _replay_on(traces: Any, specs: list[str], request_ids: Sequence[str]) -> list[dict[str, Any]]:
    from rift_ada.policies.evaluate import evaluate_policies

    ids = set(request_ids)
    keep = [index for index, rid in enumerate(traces.requests["request_id"]) if str(rid) in ids]
    rows = evaluate_policies(traces.subset(keep), specs)
    return [{key: row[key] for key in ("policy", "mean_al", "refreshes_per_1k")} for row in rows]


def _source_commit() -> str | None:
    """The git commit checked out now (None outside a git checkout); read as an invocation begins."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def run_bench(
    out_dir: str | Path,
    *,
    size: str | BenchSize = "full",
    model: str = "smollm2-135m",
    seed: int = 0,
    dataset: str = "embedded",
    device: str = "cpu",
    dtype: str | None = None,
    progress: Progress | None = None,
    command: str | None = None,
    engine_controllers: bool = False,
    token_progress: TokenProgress | None = None,
) -> dict[str, Any]:
    """Run (or continue) the benchmark into ``out_dir``; returns the summary written to ``bench.json``.

    ``progress(stage, done, total)`` per finished request or step; ``token_progress(stage)`` (optional) gives
    each long stage (targets, probe, closed loop) an ``on_tokens(tokens, rounds)`` called as tokens are
    committed, so a stage's progress moves between finished requests.

    A second run on the same ``out_dir`` while this one lives is refused (``LeaseHeldError``).
    ``engine_controllers``: per cell whose best controller reads ``query_drift``, also calibrate and
    confirm one without it (:mod:`rift_ada.experiments.engine_controller`), kept as the cell's
    ``engine_controller``."""
    from rift_ada.collectors.lease import run_lock

    settings_size = bench_size(size) if isinstance(size, str) else size
    settings_size.check()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with run_lock(out, "bench", what=f"rift-ada bench on {out}"):  # one process per run directory
        return _run_bench(out, settings_size, model=model, seed=seed, dataset=dataset, device=device, dtype=dtype,
                          progress=progress, command=command, engine_controllers=engine_controllers,
                          token_progress=token_progress)  # fmt: skip


def _run_bench(
    out: Path, settings_size: BenchSize, *, model: str, seed: int, dataset: str, device: str, dtype: str | None,
    progress: Progress | None, command: str | None, engine_controllers: bool = False,
    token_progress: TokenProgress | None = None,
) -> dict[str, Any]:  # fmt: skip
    import torch

    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests
    from rift_ada.collectors.targets.files import targets_provenance

    commit = _source_commit()  # now: the checkout may move on while a long run works
    threads = torch.get_num_threads()
    ledger = _TimeLedger.open(out / "timings.json", commit, threads)
    if others := ledger.other_thread_counts():
        logging.getLogger("rift_ada").warning(
            "%s: resuming at %d torch thread(s), where earlier invocations ran at %s: torch's CPU attention rounds "
            "some steps differently at another count, so the resumed stages may differ from a whole run in their last "
            "bits (docs/design-notes.md, 'Resuming')", out, threads, ", ".join(map(str, others)),
        )  # fmt: skip
    stages = _Stages(progress or (lambda stage, done, total: None), token_progress, ledger=ledger)
    started = time.monotonic()
    stages.progress("load model", 0, 1)
    pair = load_pair(model, device=device, dtype=dtype)
    stages.progress("load model", 1, 1)
    requests, extra_requests = select_all_requests(load_requests(dataset, pair.tokenizer), settings_size)
    registry = _Registry(out / "bench.json")
    cells: dict[str, Any] = {}
    controllers: dict[str, str] = {}
    workload: dict[str, Any] = {}  # per temperature: how the targets end, their lengths, loops
    for temperature in settings_size.temperatures:
        folder = out / f"T{temperature:g}"
        began = time.monotonic()
        targets = ensure_targets(
            pair,
            [*requests, *extra_requests],
            folder / "targets.parquet",
            temperature=temperature,
            seed=seed,
            max_new_tokens=settings_size.output_tokens,
            min_new_tokens=settings_size.output_tokens if settings_size.forced_length else 0,
            extend=True,
            on_request=stages.counter(f"T{temperature:g} targets", len(requests) + len(extra_requests)),
            on_token=stages.token_counter(f"T{temperature:g} targets"),
            batch_size=settings_size.batch_size,
        )
        stages.timed(f"T{temperature:g} targets", time.monotonic() - began)
        provenance = targets_provenance(folder / "targets.parquet")
        workload[f"T{temperature:g}"] = target_workload(targets, settings_size, pair.tokenizer, provenance)
        kept = set(workload[f"T{temperature:g}"]["loops"]["kept"])
        if len(kept) < 6:
            raise CalibrationError(
                f"loop_rule: only {len(kept)} of {len(requests)} target responses at T = {temperature:g} are not "
                f"looping ({settings_size.loop_detector().settings()}); a cell needs >= 6: add requests or keep loops"
            )
        cell_requests = [request for request in requests if request.request_id in kept]
        cell_targets = [row for row in targets if row["request_id"] in kept]
        cell_extra = [request for request in extra_requests if request.request_id in kept]  # the same loop rule
        for budget in settings_size.budgets:
            cell = run_cell(
                pair, cell_requests, cell_targets, folder / f"B{budget}", size=settings_size, temperature=temperature,
                budget=budget, seed=seed, dataset=dataset, stages=stages, targets_manifest=provenance,
                extra_requests=cell_extra, register=registry.register,
            )  # fmt: skip
            from rift_ada.experiments.engine_controller import engine_controller, finished_engine_controller

            if engine_controllers:
                cell["engine_controller"] = engine_controller(
                    pair, cell_requests, cell_targets, folder / f"B{budget}", cell, size=settings_size, seed=seed,
                    dataset=dataset, stages=stages,
                )  # fmt: skip
            elif (known := finished_engine_controller(folder / f"B{budget}", cell)) is not None:
                cell["engine_controller"] = known  # made by an earlier --export-controllers run: kept in the report
            cells[cell["tag"]] = cell
            controllers[cell["tag"]] = cell["controller_path"]
    summary = {
        "format": BENCH_FORMAT,
        "version": BENCH_VERSION,
        "model": pair.preset.name,
        "draft": pair.preset.draft,
        "target": pair.preset.target_name,
        "seed": seed,
        "dataset": dataset,
        "device": device,
        "dtype": dtype or "float32",
        "size": asdict(settings_size),
        "n_requests": len(requests),
        "confirmation_only_requests": len(extra_requests),
        "preregistrations": registry.entries,
        "isl": [request.isl for request in requests],
        "categories": sorted({request.category for request in requests}),
        "targets": workload,
        "cells": cells,
        "timings": dict(stages.timings),
        "wall_s": round(time.monotonic() - started, 1),
        **_ledger_summary(stages.ledger),
        "command": command,
        "source_commit": commit,  # as this invocation began; each invocation's is in ``invocations``
    }
    summary = json_safe(summary)
    atomic_write_json(out / "bench.json", summary)
    report_path = write_bench_report(summary, out)
    return {"report": str(report_path), "controllers": controllers, "bench": summary}


def _ledger_summary(ledger: _TimeLedger | None) -> dict[str, Any]:
    """bench.json's times over every invocation of the run (``timings``/``wall_s``: the last invocation's)."""
    if ledger is None:
        return {}
    ledger.write()
    totals = {"timings_total": dict(ledger.stages), "invocations": list(ledger.invocations)}
    return totals | {"wall_total_s": ledger.wall_s, "untimed_before": ledger.untimed_before}


class _Registry:
    """Pre-registrations, written into ``bench.json`` before each cell's confirmation runs (kept across runs:
    an extension appends its new confirmation size beside the earlier one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, list[dict[str, Any]]] = {}
        if path.exists():
            try:
                stored = json.loads(path.read_text(encoding="utf-8")).get("preregistrations")
            except (OSError, ValueError):
                stored = None
            if isinstance(stored, dict):
                self.entries = {str(tag): list(items) for tag, items in stored.items()}

    def register(self, tag: str, preregistration: dict[str, Any]) -> None:
        history = self.entries.setdefault(tag, [])
        if history and history[-1] == preregistration:
            return  # the same confirmation again (a resumed run)
        history.append(json_safe(preregistration))
        current: dict[str, Any] = {}
        if self.path.exists():
            try:
                current = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                current = {}
        atomic_write_json(self.path, {**current, "format": BENCH_FORMAT, "version": BENCH_VERSION,
                                      "preregistrations": self.entries})  # fmt: skip


def export_controllers(summary: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Copy every cell's calibrated controller (closed-loop provenance included) to ``out_dir/<name>.json``,
    and beside it the cell's engine controller (no ``query_drift``) where the bench made one."""
    from rift_ada.calibrate.export import export_controller
    from rift_ada.experiments.engine_controller import needs_engine_controller

    folder = Path(out_dir)
    written = []
    for cell in summary["cells"].values():
        engine = cell.get("engine_controller") or {}
        entries = [(cell, "best")]
        if engine and not engine.get("same_as_best"):
            entries.append((engine, "engine"))
        for source, role in entries:
            path, confirmation, n_confirmation = (
                source["controller_path"], source["confirmation"], len(source["confirmation_ids"])
            )  # fmt: skip
            controller = json.loads(Path(path).read_text(encoding="utf-8"))
            controller.setdefault("calibration", {})["benchmark"] = {
                "command": summary.get("command"),
                "cell": cell["tag"],
                "role": role,
                "engine_feedable": not needs_engine_controller(controller),  # reads no query_drift
                "requests": summary["n_requests"],
                "output_tokens": summary["size"]["output_tokens"],
                "confirmation_requests": n_confirmation,
                "gain": bool(confirmation["verdict"]["gain"]),
                "verdict": confirmation["verdict"]["text"],
                "comparisons": confirmation["comparisons"],
                "curve_outcome": (source.get("curve") or {}).get("outcome"),
            }
            written.append(export_controller(controller, folder / f"{controller['name']}.json"))
    return written
