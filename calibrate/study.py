"""The Optuna study: policies sampled from the search space, scored by replay on the selection split.

Objectives: mean AL (maximise) and refreshes per 1K committed tokens (minimise). Baselines
(periodic refresh on a Δ grid and RIFT-stat) are enqueued as trials and evaluated by the same
replay. Several processes (here or on other machines) can fill one study through a shared
storage: the study is loaded with ``load_if_exists=True``, baselines are enqueued once, and the
total trial count is respected across workers (a worker that drew a trial number beyond the
budget marks it FAIL with a ``skipped`` note and stops, so COMPLETE trials never exceed it).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import multiprocessing as mp
import os
import sqlite3
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalRedisBackend
from optuna.trial import FrozenTrial, TrialState

from rift_ada.calibrate.operating_point import TrialPoint
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.policies.space import SearchSpace

DEFAULT_INTERVALS: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
FINGERPRINT_ATTR = "rift_ada_fingerprint"
BASELINE_ATTR = "baseline"
RECORD_ATTR = "rift_ada"
ProgressFn = Callable[[str, int, int | None], None]


def baseline_labels(intervals: Sequence[int] = DEFAULT_INTERVALS, reference_interval: int = 128) -> list[str]:
    """Replay names of the baselines: ``periodic:Δ`` for each Δ (the reference included) and ``stat``."""
    grid = sorted({int(d) for d in intervals} | {int(reference_interval)})
    if grid[0] <= 0:
        raise CalibrationError(f"periodic intervals must be positive, got {grid}")
    return [f"periodic:{d}" for d in grid] + ["stat"]


def baseline_policy(label: str) -> tuple[str, dict[str, Any]]:
    """(family, policy JSON) recorded for a baseline replay name."""
    if label.startswith("periodic:"):
        return "periodic", {"kind": "periodic", "interval": int(label.split(":", 1)[1])}
    return label, {"kind": label}


def open_storage(storage: str | BaseStorage) -> BaseStorage:
    """Storage from a URL: any SQLAlchemy URL (``sqlite:///run/study.db``, ``postgresql://...``),
    ``redis://...`` (journal on Redis), or ``journal:PATH`` / a path ending in ``.log`` or
    ``.journal`` (journal file, safe on shared file systems)."""
    if isinstance(storage, BaseStorage):
        return storage
    url = str(storage)
    if url.startswith("redis://") or url.startswith("rediss://"):
        return JournalStorage(JournalRedisBackend(url))
    if url.startswith("journal:") or url.endswith((".log", ".journal")):
        path = url[len("journal:") :] if url.startswith("journal:") else url
        path = path[2:] if path.startswith("//") else path
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    if "://" not in url:
        raise CalibrationError(
            f"storage {url!r} is not a URL: use sqlite:///PATH, an RDB URL, redis://..., or journal:PATH"
        )
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        rdb = RDBStorage(url, engine_kwargs={"creator": _sqlite_creator(url[len("sqlite:///") :])})
        # pysqlite runs SELECTs outside transactions, so two processes could both see a WAITING
        # trial and both pop it. One IMMEDIATE transaction per session makes read-then-write atomic.
        sqlalchemy.event.listen(rdb.engine, "begin", _begin_immediate)
        return rdb
    return RDBStorage(url)


def _begin_immediate(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _sqlite_creator(path: str) -> Callable[[], sqlite3.Connection]:
    """SQLite connections for a study file: WAL journal (readers never block the writer), commits
    without fsync (``synchronous=NORMAL``; the database stays consistent, a power cut may lose the
    last trials), a long lock timeout so several worker processes wait instead of failing, and
    transactions left to SQLAlchemy (``isolation_level=None``; see ``_begin_immediate``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=120.0, check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    return connect


@dataclass
class PolicyEvaluator:
    """Replays policies on one split; results are cached by the policy's canonical JSON."""

    traces: ProbeTraces
    controller_fields: dict[str, Any]
    position_bin: int = 256
    _cache: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)

    def controller(self, policy: dict[str, Any]) -> dict[str, Any]:
        """Full controller JSON v1 dict around a policy."""
        from rift_ada.calibrate.export import controller_dict

        return controller_dict(policy, **self.controller_fields)

    def run_many(self, policies: Sequence[dict[str, Any] | str]) -> list[Any]:
        """ReplayResults of policy JSONs or replay names (``stat``, ``full``, ``periodic:N``), in order."""
        from rift_ada.policies.replay import replay_many

        targets = [p if isinstance(p, str) else self.controller(p) for p in policies]
        return replay_many(self.traces, targets, position_bin=self.position_bin)

    @staticmethod
    def _key(policy: dict[str, Any] | str) -> str:
        return policy if isinstance(policy, str) else json.dumps(policy, sort_keys=True)

    def evaluate(self, policy: dict[str, Any] | str) -> tuple[float, float]:
        """(mean AL, refreshes per 1K tokens) of a policy."""
        return self.evaluate_many([policy])[0]

    def evaluate_many(self, policies: Sequence[dict[str, Any] | str]) -> list[tuple[float, float]]:
        """(mean AL, refreshes per 1K) of each policy; the uncached ones replay together (``replay_many``)."""
        from rift_ada.policies.replay import replay_many

        keys = [self._key(p) for p in policies]
        todo: dict[str, dict[str, Any] | str] = {}
        for key, policy in zip(keys, policies, strict=True):
            if key not in self._cache and key not in todo:
                todo[key] = policy if isinstance(policy, str) else self.controller(policy)
        if todo:
            results = replay_many(self.traces, list(todo.values()), position_bin=self.position_bin)
            for key, result in zip(todo, results, strict=True):
                self._cache[key] = (float(result.mean_al), float(result.refreshes_per_1k))
        return [self._cache[key] for key in keys]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state


@dataclass
class StudyTask:
    """Everything a worker needs to add trials to the shared study (picklable)."""

    storage: str
    study_name: str
    n_trials: int
    seed: int
    space: SearchSpace
    evaluator: PolicyEvaluator
    baselines: tuple[str, ...]
    timeout: float | None = None
    batch_size: int = 8

    @property
    def total_trials(self) -> int:
        """COMPLETE trials the study ends with: the search trials plus the baselines."""
        return self.n_trials + len(self.baselines)

    def fingerprint(self) -> str:
        """Hash of what makes trials comparable: space, selection requests, baselines, controller fields.

        The trial budget is not part of it, so a later run with more trials extends the study."""
        blob = json.dumps(
            {
                "space": self.space.fingerprint(),
                "requests": [str(x) for x in self.evaluator.traces.requests["request_id"]],
                "baselines": list(self.baselines),
                "controller": self.evaluator.controller_fields,
            },
            sort_keys=True,
            default=str,
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_sampler(seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    """Seeded multi-objective TPE (independent sampling).

    Workers sharing a study get different seeds instead of the constant-liar heuristic: with an
    RDB storage the liar re-reads the running trials for every parameter, which costs more than
    the replays themselves (docs/performance.md).
    """
    _quiet_optuna()
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(10, min(30, n_trials // 10)), constant_liar=False)


def prepare_study(task: StudyTask, *, worker_index: int = 0, parallel: bool = False) -> optuna.Study:
    """Create or load the study, check that it was built from the same inputs, enqueue missing baselines."""
    _quiet_optuna()
    storage = open_storage(task.storage)
    study = optuna.create_study(
        storage=storage,
        study_name=task.study_name,
        directions=["maximize", "minimize"],
        sampler=make_sampler(task.seed + worker_index, task.n_trials),
        load_if_exists=True,
    )
    fingerprint = task.fingerprint()
    existing = study.user_attrs.get(FINGERPRINT_ATTR)
    if existing is None:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
        study.set_metric_names(["mean_al", "refreshes_per_1k"])
    elif existing != fingerprint:
        raise CalibrationError(
            f"study {task.study_name!r} in {task.storage} was built from different traces, splits, "
            f"search space or controller settings (fingerprint {existing} != {fingerprint}); "
            "use a new run directory, storage or study name"
        )
    trials = study.get_trials(deepcopy=False)
    if not parallel and any(t.state == TrialState.RUNNING for t in trials):
        # Joining a study other processes are filling: sample with a seed of our own.
        study.sampler = make_sampler(task.seed + 1 + os.getpid(), task.n_trials)
    have = {t.user_attrs.get(BASELINE_ATTR) for t in trials}
    for label in task.baselines:
        if label not in have:
            study.enqueue_trial({}, user_attrs={BASELINE_ATTR: label})
    return study


_COUNTED = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)


def _propose(task: StudyTask, trial: optuna.Trial, worker: int) -> tuple[dict[str, Any] | str, dict[str, Any]]:
    """(what to replay, the record stored on the trial): a baseline name, or a sampled policy."""
    label = trial.user_attrs.get(BASELINE_ATTR)
    if label:
        family, policy = baseline_policy(label)
        return label, {"label": label, "family": family, "policy": policy, "worker": worker}
    family, policy = task.space.suggest(trial)
    return policy, {"label": f"trial:{trial.number}", "family": family, "policy": policy, "worker": worker}


def run_worker(
    task: StudyTask, *, worker_index: int = 0, parallel: bool = False, progress: ProgressFn | None = None
) -> int:
    """Add trials to the shared study until it holds ``task.total_trials`` or the timeout passes.

    Trials are asked in batches of ``task.batch_size`` and replayed together. ``worker_index``
    offsets the sampler seed; ``parallel`` says other workers share the study. Returns the number
    of trials this worker completed.
    """
    study = prepare_study(task, worker_index=worker_index, parallel=parallel)
    total = task.total_trials
    start = time.monotonic()
    done = 0
    exhausted = False
    while not exhausted:
        if task.timeout is not None and time.monotonic() - start >= task.timeout:
            break
        batch: list[tuple[optuna.Trial, dict[str, Any] | str, dict[str, Any]]] = []
        asked: list[optuna.Trial] = []
        skipped: set[int] = set()
        try:
            counted = study.get_trials(deepcopy=False, states=_COUNTED)
            waiting = sum(t.state == TrialState.WAITING for t in counted)
            slots = max(total - len(counted), 0) + waiting
            if slots == 0:
                break
            for _ in range(min(max(1, task.batch_size), slots)):
                asked.append(study.ask())
            # Other workers may have asked meanwhile: a trial is within budget only if fewer than
            # `total` counted trials have a smaller number (numbers are unique and ordered).
            numbers = sorted(t.number for t in study.get_trials(deepcopy=False, states=_COUNTED))
            for trial in asked:
                if bisect.bisect_left(numbers, trial.number) >= total:
                    trial.set_user_attr("skipped", "trial budget already taken by other workers")
                    study.tell(trial, state=TrialState.FAIL)
                    skipped.add(trial.number)
                    exhausted = True
                else:
                    batch.append((trial, *_propose(task, trial, worker_index)))
            if not batch:
                break
            values = task.evaluator.evaluate_many([target for _, target, _ in batch])
        except BaseException:
            for trial in asked:
                if trial.number not in skipped:
                    study.tell(trial, state=TrialState.FAIL)
            raise
        for (trial, _, record), (al, refreshes) in zip(batch, values, strict=True):
            trial.set_user_attr(RECORD_ATTR, record)
            study.tell(trial, [al, refreshes])
        done += len(batch)
        if progress is not None:
            complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            progress("study", complete, total)
    return done


def _worker_entry(task: StudyTask, worker_index: int, barrier: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prepare_study(task, worker_index=worker_index, parallel=True)  # imports and storage ready
    barrier.wait(timeout=300)  # start sampling together
    run_worker(task, worker_index=worker_index, parallel=True)


def run_study(task: StudyTask, *, workers: int = 1, progress: ProgressFn | None = None) -> optuna.Study:
    """Fill the study with ``workers`` processes (1: in this process) and return it loaded."""
    if workers < 1:
        raise CalibrationError(f"workers must be at least 1, got {workers}")
    if task.n_trials < 0:
        raise CalibrationError(f"trials must be non-negative, got {task.n_trials}")
    study = prepare_study(task)
    if workers == 1:
        run_worker(task, progress=progress)
    else:
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(workers)
        procs = [ctx.Process(target=_worker_entry, args=(task, i, barrier)) for i in range(workers)]
        for proc in procs:
            proc.start()
        try:
            while any(p.is_alive() for p in procs):
                for proc in procs:
                    proc.join(timeout=0.5)
                if progress is not None:
                    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
                    progress("study", complete, task.total_trials)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
        failed = [i for i, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            raise CalibrationError(f"study worker(s) {failed} exited with codes {[procs[i].exitcode for i in failed]}")
    wait_for_running(study)
    if progress is not None:
        complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        progress("study", complete, task.total_trials)
    return study


def wait_for_running(study: optuna.Study, *, timeout: float = 120.0, poll: float = 0.25) -> int:
    """Wait until no trial of the study is RUNNING (other workers finishing); returns how many still are.

    A trial still running after ``timeout`` seconds is taken for a crashed worker's and ignored.
    """
    deadline = time.monotonic() + timeout
    while True:
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if running == 0 or time.monotonic() >= deadline:
            return running
        time.sleep(poll)


def trial_point(trial: FrozenTrial) -> TrialPoint:
    """A completed trial as a :class:`TrialPoint`."""
    attrs = trial.user_attrs
    record = attrs.get(RECORD_ATTR, {})
    assert trial.values is not None
    return TrialPoint(
        number=trial.number,
        label=str(record.get("label", f"trial:{trial.number}")),
        family=str(record.get("family", "")),
        policy=dict(record.get("policy", {})),
        params=dict(trial.params),
        al=float(trial.values[0]),
        refreshes_per_1k=float(trial.values[1]),
        baseline=bool(attrs.get(BASELINE_ATTR)),
    )


def study_points(study: optuna.Study) -> list[TrialPoint]:
    """Every COMPLETE trial, by trial number."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [trial_point(t) for t in sorted(trials, key=lambda t: t.number)]
