"""The Optuna study: policies sampled from the search space, scored by replay on the selection split.

Objectives: mean AL (maximise) and refreshes per 1K committed tokens (minimise). Baselines
(periodic refresh on a Δ grid and RIFT-stat) are enqueued as trials and evaluated by the same
replay. Several processes (here or on other machines) can fill one study through a shared
storage: the study is loaded with ``load_if_exists=True``, baselines are enqueued once, and the
total trial count is respected across workers (a worker that drew a trial number beyond the
budget marks it FAIL with a ``skipped`` note and stops, so COMPLETE trials never exceed it).

Crashed workers: on RDB storages (the default SQLite file, PostgreSQL, MySQL) every trial being
evaluated records a heartbeat every ``heartbeat_interval`` seconds; a RUNNING trial whose last
heartbeat is older than ``grace_period`` belongs to a dead worker (SIGKILL, OOM, power loss). Any
worker marks it FAIL and re-enqueues it with the same parameters and labels (Optuna's
``RetryHeartbeatStaleTrialCallback``), so a rerun after a crash ends with exactly the asked number
of COMPLETE trials and waits at most one grace period. Journal storages have no heartbeat: their
dead trials are ignored after ``wait_for_running``'s timeout.

Reruns sample what an uninterrupted run samples: a single worker seeds the sampler of each new
trial from the run's seed and the trial's *slot* (the COMPLETE trials when its batch was asked, plus
its place in the batch), a batch holds either re-enqueued trials or new ones, never both, and new
trials are labelled by slot (``trial:<slot>``), not by Optuna's trial number (failed trials take
numbers). So after a fault inside the study (SIGKILL, SIGTERM, a full disk) the rerun re-evaluates
the lost trials with their own parameters, then asks the same slots from the same history.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, fail_stale_trials
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.storages.journal import JournalFileBackend, JournalRedisBackend
from optuna.trial import FrozenTrial, TrialState

from rift_ada.atomic import DiskFullError, is_disk_full, reporting_disk_full
from rift_ada.calibrate.operating_point import TrialPoint
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.policies.space import SearchSpace
from rift_ada.policy_spec import PERIODIC, STAT, parse, periodic_label

DEFAULT_INTERVALS: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
FINGERPRINT_ATTR = "rift_ada_fingerprint"
BASELINE_ATTR = "baseline"
RECORD_ATTR = "rift_ada"
SLOT_LABEL_ATTR = "slot_label"  # a new trial's label, kept when a fault re-enqueues it
ProgressFn = Callable[[str, int, int | None], None]
HEARTBEAT_INTERVAL_S = 2  # seconds between heartbeats of a trial being evaluated (RDB storages)
GRACE_PERIOD_S = 10  # a RUNNING trial without a heartbeat for this long belongs to a dead worker
SEARCH_REPLICAS = 1  # replay replicas per study evaluation at T > 0 (common random numbers; see PolicyEvaluator)
DISK_FULL_EXIT = 28  # a study worker process that found the disk full exits with this code (errno ENOSPC)
MAX_RETRIES = 3  # a trial whose evaluation kills its worker this often is given up (a new one is asked)


def baseline_labels(intervals: Sequence[int] = DEFAULT_INTERVALS, reference_interval: int = 128) -> list[str]:
    """Replay names of the baselines: ``periodic:Δ`` for each Δ (the reference included) and ``stat``."""
    grid = sorted({int(d) for d in intervals} | {int(reference_interval)})
    if grid[0] <= 0:
        raise CalibrationError(f"periodic intervals must be positive, got {grid}")
    return [periodic_label(d) for d in grid] + [STAT]


def baseline_policy(label: str) -> tuple[str, dict[str, Any]]:
    """(family, policy JSON) recorded for a baseline replay name."""
    spec = parse(label)
    if spec.is_periodic:
        return PERIODIC, {"kind": PERIODIC, "interval": spec.interval}
    return spec.label, {"kind": spec.label}


def _stale_trial_retry() -> dict[str, Any]:
    """RDBStorage keyword: re-enqueue a dead worker's trial (same params and labels), at most MAX_RETRIES times."""
    from optuna import storages

    retry = getattr(storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is not None:  # optuna >= 4.9
        return {"heartbeat_stale_trial_callback": retry(max_retry=MAX_RETRIES)}
    return {"failed_trial_callback": storages.RetryFailedTrialCallback(max_retry=MAX_RETRIES)}


class HeartbeatRDBStorage(RDBStorage):
    """An RDBStorage that records a trial's first heartbeat the moment it becomes RUNNING.

    Optuna creates (or pops) the RUNNING trial inside ``study.ask()`` and the worker can only record
    a heartbeat after ``ask`` returns; a worker killed in between would leave a RUNNING trial with no
    heartbeat, which Optuna never takes for stale. Recording it here narrows that window to the two
    SQL statements.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unbeaten_since: dict[int, float] = {}  # RUNNING trials without a heartbeat: first seen (monotonic)

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        # Optuna's cache layer calls this private method (and create_new_trial does too); the test
        # test_a_trial_killed_right_after_ask_still_goes_stale notices if a new Optuna stops doing so.
        trial = super()._create_new_trial(study_id, template_trial)
        if trial.state == TrialState.RUNNING and self.heartbeat_interval is not None:
            self.record_heartbeat(trial._trial_id)
        return trial

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        updated = super().set_trial_state_values(trial_id, state, values)
        if updated and state == TrialState.RUNNING and self.heartbeat_interval is not None:
            self.record_heartbeat(trial_id)
        return updated

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Optuna's stale trials, plus RUNNING trials that this process has seen without any heartbeat for
        longer than the grace period.

        Optuna never takes a trial that never beat for stale; here one is left only by a worker that died
        between the trial's creation and its first heartbeat, or whose first heartbeat failed (a full disk
        after the trial's row was written). A live worker beats in the same breath as creating the trial,
        so such a trial is dead. Its age is measured on this process's monotonic clock from the first time
        it was seen, so no two machines' clocks are compared."""
        stale = super()._get_stale_trial_ids(study_id)
        grace = self.grace_period if self.grace_period is not None else 2 * (self.heartbeat_interval or 0)
        now = time.monotonic()
        seen = self._unbeaten_since
        unbeaten = self._unbeaten_running_ids(study_id)
        for trial_id in list(seen):
            if trial_id not in unbeaten:
                del seen[trial_id]
        for trial_id in unbeaten:
            since = seen.setdefault(trial_id, now)
            if now - since > grace and trial_id not in stale:
                stale.append(trial_id)
        return stale

    def _unbeaten_running_ids(self, study_id: int) -> set[int]:
        """RUNNING trials of the study with no heartbeat row (Optuna's own models; see the test
        test_a_running_trial_that_never_beat_goes_stale)."""
        from optuna.storages._rdb import models

        session = self.scoped_session()
        try:
            beaten = sqlalchemy.select(models.TrialHeartbeatModel.trial_id)
            query = (
                sqlalchemy.select(models.TrialModel.trial_id)
                .where(models.TrialModel.study_id == study_id)
                .where(models.TrialModel.state == TrialState.RUNNING)
                .where(models.TrialModel.trial_id.not_in(beaten))
            )
            return {int(trial_id) for trial_id in session.execute(query).scalars()}
        finally:
            session.close()


def _rdb(url: str, heartbeat_interval: int, grace_period: int, **kwargs: Any) -> RDBStorage:
    return HeartbeatRDBStorage(
        url, heartbeat_interval=heartbeat_interval, grace_period=grace_period, **_stale_trial_retry(), **kwargs
    )


def open_storage(
    storage: str | BaseStorage,
    *,
    heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
    grace_period: int = GRACE_PERIOD_S,
) -> BaseStorage:
    """Storage from a URL: any SQLAlchemy URL (``sqlite:///run/study.db``, ``postgresql://...``),
    ``redis://...`` (journal on Redis), or ``journal:PATH`` / a path ending in ``.log`` or
    ``.journal`` (journal file, safe on shared file systems). RDB storages get heartbeats, so
    trials of crashed workers are failed and retried (module docstring)."""
    if isinstance(storage, BaseStorage):
        return storage
    _quiet_optuna()
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
        creator = _sqlite_creator(url[len("sqlite:///") :])
        rdb = _rdb(url, heartbeat_interval, grace_period, engine_kwargs={"creator": creator})
        # pysqlite runs SELECTs outside transactions, so two processes could both see a WAITING
        # trial and both pop it. One IMMEDIATE transaction per session makes read-then-write atomic.
        sqlalchemy.event.listen(rdb.engine, "begin", _begin_immediate)
        return rdb
    return _rdb(url, heartbeat_interval, grace_period)


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
    """Replays policies on one split; results are cached by the policy's canonical JSON.

    ``replicas``: sampling replicas of replay at T > 0. Every policy sees the same seeded uniforms
    (seed 0), so comparisons between policies are paired whatever the count; the study searches
    with :data:`SEARCH_REPLICAS` and the confirmation uses replay's default (docs/calibration.md).
    """

    traces: ProbeTraces
    controller_fields: dict[str, Any]
    position_bin: int = 256
    replicas: int | None = None  # sampling replicas at T > 0 (None: replay's default); T = 0 is exact
    _cache: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)

    def controller(self, policy: dict[str, Any]) -> dict[str, Any]:
        """Full controller JSON v1 dict around a policy."""
        from rift_ada.calibrate.export import controller_dict

        return controller_dict(policy, **self.controller_fields)

    def run_many(self, policies: Sequence[dict[str, Any] | str]) -> list[Any]:
        """ReplayResults of policy JSONs or replay names (``stat``, ``full``, ``periodic:N``), in order."""
        from rift_ada.policies.replay import replay_many

        targets = [p if isinstance(p, str) else self.controller(p) for p in policies]
        return replay_many(self.traces, targets, position_bin=self.position_bin, replicas=self.replicas)

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
            results = replay_many(
                self.traces, list(todo.values()), position_bin=self.position_bin, replicas=self.replicas
            )
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
    heartbeat_interval: int = HEARTBEAT_INTERVAL_S
    grace_period: int = GRACE_PERIOD_S

    @property
    def total_trials(self) -> int:
        """COMPLETE trials the study ends with: the search trials plus the baselines."""
        return self.n_trials + len(self.baselines)

    def fingerprint(self) -> str:
        """Hash of what makes trials comparable: space, selection requests, baselines, controller fields
        and replay replicas.

        The trial budget is not part of it, so a later run with more trials extends the study."""
        blob = json.dumps(
            {
                "space": self.space.fingerprint(),
                "requests": [str(x) for x in self.evaluator.traces.requests["request_id"]],
                "baselines": list(self.baselines),
                "controller": self.evaluator.controller_fields,
                "replicas": self.evaluator.replicas,
            },
            sort_keys=True,
            default=str,
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=".*failed_trial_callback.*", category=FutureWarning)
    # Heartbeats are recorded by this module's own thread around ask/tell (see _Heartbeats).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used", category=UserWarning)


def make_sampler(seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    """Seeded multi-objective TPE (independent sampling).

    Workers sharing a study get different seeds instead of the constant-liar heuristic: with an
    RDB storage the liar re-reads the running trials for every parameter, which costs more than
    the replays themselves (docs/performance.md).
    """
    _quiet_optuna()
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(10, min(30, n_trials // 10)), constant_liar=False)


def slot_seed(seed: int, slot: int) -> int:
    """The sampler seed of the new trial in ``slot`` (a rerun after a fault draws the same one)."""
    return int(np.random.SeedSequence([seed, slot]).generate_state(1)[0])


def prepare_study(task: StudyTask, *, worker_index: int = 0, parallel: bool = False) -> tuple[optuna.Study, bool]:
    """Create or load the study, check that it was built from the same inputs, enqueue missing baselines.

    Returns the study and whether this worker samples slot-seeded (alone: not ``parallel`` and no live
    process filling the study)."""
    _quiet_optuna()
    storage = open_storage(task.storage, heartbeat_interval=task.heartbeat_interval, grace_period=task.grace_period)
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
    fail_stale_trials(study)  # trials of workers that died: FAIL, and re-enqueued with the same parameters
    if not parallel and study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # A dead run's trials go stale within one grace period (and come back WAITING); a live one's finish.
        wait_for_running(study, timeout=task.grace_period + 2 * task.heartbeat_interval)
    trials = study.get_trials(deepcopy=False)
    if not parallel and any(t.state == TrialState.RUNNING for t in trials):
        # Joining a study other processes are filling: sample with a seed of our own.
        study.sampler = make_sampler(task.seed + 1 + os.getpid(), task.n_trials)
        parallel = True
    have = {t.user_attrs.get(BASELINE_ATTR) for t in trials if t.state in _COUNTED}
    for label in task.baselines:
        if label not in have:
            study.enqueue_trial({}, user_attrs={BASELINE_ATTR: label})
    return study, not parallel


_COUNTED = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)


class _Heartbeats:
    """Records a heartbeat for each trial this worker holds, at once and then every interval, on a thread."""

    def __init__(self, study: optuna.Study) -> None:
        storage = study._storage
        self.interval = storage.get_heartbeat_interval() if is_heartbeat_enabled(storage) else None
        self.storage: Any = storage
        self.trial_ids: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def add(self, trial: optuna.Trial) -> optuna.Trial:
        """Hold ``trial``: its first heartbeat now, so a worker killed from here on leaves a trial that goes stale."""
        if self.interval is not None:
            self.trial_ids.append(trial._trial_id)
            self._record([trial._trial_id])
        return trial

    def _record(self, trial_ids: Sequence[int]) -> None:
        for trial_id in trial_ids:
            with contextlib.suppress(Exception):  # a trial another worker failed meanwhile; a busy database
                self.storage.record_heartbeat(trial_id)

    def _beat(self) -> None:
        assert self.interval is not None
        while not self.stop.wait(self.interval):
            self._record(list(self.trial_ids))

    def __enter__(self) -> _Heartbeats:
        if self.interval is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.interval is not None:
            self.stop.set()
            self.thread.join()


def _tell(study: optuna.Study, trial: optuna.Trial, *args: Any, **kwargs: Any) -> bool:
    """``study.tell``; False when the trial was already finished (failed as stale and retried elsewhere)."""
    try:
        study.tell(trial, *args, **kwargs)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


def _propose(
    task: StudyTask, trial: optuna.Trial, worker: int, slot: int | None
) -> tuple[dict[str, Any] | str, dict[str, Any]]:
    """(what to replay, the record stored on the trial): a baseline name, or a sampled policy.

    ``slot``: where the new trial sits in a single worker's run (its sampler is seeded from it and
    its label names it); None for a worker sharing the study (labelled by trial number)."""
    label = trial.user_attrs.get(BASELINE_ATTR)
    if label:
        family, policy = baseline_policy(label)
        return label, {"label": label, "family": family, "policy": policy, "worker": worker}
    label = trial.user_attrs.get(SLOT_LABEL_ATTR)  # re-enqueued after a fault: keeps its label
    if label is None:
        label = f"trial:{trial.number if slot is None else slot}"
        trial.set_user_attr(SLOT_LABEL_ATTR, label)
    family, policy = task.space.suggest(trial)
    return policy, {"label": label, "family": family, "policy": policy, "worker": worker}


def run_worker(
    task: StudyTask, *, worker_index: int = 0, parallel: bool = False, progress: ProgressFn | None = None
) -> int:
    """Add trials to the shared study until it holds ``task.total_trials`` or the timeout passes.

    Trials are asked in batches of ``task.batch_size`` and replayed together. ``worker_index``
    offsets the sampler seed; ``parallel`` says other workers share the study. Returns the number
    of trials this worker completed.
    """
    study, seeded = prepare_study(task, worker_index=worker_index, parallel=parallel)
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
        counted = study.get_trials(deepcopy=False, states=_COUNTED)
        waiting = sum(t.state == TrialState.WAITING for t in counted)
        slots = max(total - len(counted), 0) + waiting
        complete = sum(t.state == TrialState.COMPLETE for t in counted)
        if seeded and waiting:
            slots = waiting  # re-enqueued (or baseline) trials make a batch of their own: slots stay aligned
        if slots == 0:
            if _await_running(study, total):  # dead workers' trials were failed and re-enqueued
                continue
            break
        with _Heartbeats(study) as heartbeats:
            try:
                for _ in range(min(max(1, task.batch_size), slots)):
                    asked.append(heartbeats.add(study.ask()))
                # Other workers may have asked meanwhile: a trial is within budget only if fewer than
                # `total` counted trials have a smaller number (numbers are unique and ordered).
                numbers = sorted(t.number for t in study.get_trials(deepcopy=False, states=_COUNTED))
                for trial in asked:
                    if bisect.bisect_left(numbers, trial.number) >= total:
                        trial.set_user_attr("skipped", "trial budget already taken by other workers")
                        _tell(study, trial, state=TrialState.FAIL)
                        skipped.add(trial.number)
                        exhausted = True
                    else:
                        slot = complete + len(batch) if seeded else None
                        if slot is not None:
                            study.sampler = make_sampler(slot_seed(task.seed + worker_index, slot), task.n_trials)
                        batch.append((trial, *_propose(task, trial, worker_index, slot)))
                if not batch:
                    break
                values = task.evaluator.evaluate_many([target for _, target, _ in batch])
            except BaseException:
                for trial in asked:
                    if trial.number not in skipped:
                        _tell(study, trial, state=TrialState.FAIL)
                raise
            for (trial, _, record), (al, refreshes) in zip(batch, values, strict=True):
                try:
                    trial.set_user_attr(RECORD_ATTR, record)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # failed as stale by another worker (this one stalled); its retry redoes it
                done += _tell(study, trial, [al, refreshes])
        if progress is not None:
            complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            progress("study", complete, total)
    return done


def _worker_entry(task: StudyTask, worker_index: int, barrier: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        prepare_study(task, worker_index=worker_index, parallel=True)  # imports and storage ready
        barrier.wait(timeout=300)  # start sampling together
        run_worker(task, worker_index=worker_index, parallel=True)
    except Exception as error:
        if is_disk_full(error):  # said once, by the parent, as the one full-disk line (no traceback here)
            sys.exit(DISK_FULL_EXIT)
        raise


def check_study_size(trials: int, workers: int) -> None:
    """Refuse a negative trial count or fewer than one worker (the calibration config checks with this too)."""
    if workers < 1:
        raise CalibrationError(f"workers must be at least 1, got {workers}")
    if trials < 0:
        raise CalibrationError(f"trials must be non-negative, got {trials}")


def run_study(task: StudyTask, *, workers: int = 1, progress: ProgressFn | None = None) -> optuna.Study:
    """Fill the study with ``workers`` processes (1: in this process) and return it loaded."""
    check_study_size(task.n_trials, workers)
    with reporting_disk_full(storage_file(task.storage) or _shown_url(task.storage)):
        return _run_study(task, workers=workers, progress=progress)


def storage_file(storage: str) -> str | None:
    """The local file of a SQLite or journal-file storage URL (None for servers and in-memory SQLite)."""
    if storage.startswith("sqlite:///") and storage != "sqlite:///:memory:":
        return storage[len("sqlite:///") :]
    if storage.startswith("journal:") or storage.endswith((".log", ".journal")):
        path = storage[len("journal:") :] if storage.startswith("journal:") else storage
        return path[2:] if path.startswith("//") else path
    return None


def _shown_url(url: str) -> str:
    """A server storage's URL without its password (what a full-disk error names)."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy URL (redis://...): drop any credentials before the host
        return url.split("://", 1)[0] + "://" + url.rsplit("@", 1)[-1].split("://")[-1]


def _run_study(task: StudyTask, *, workers: int, progress: ProgressFn | None) -> optuna.Study:
    study, _ = prepare_study(task)
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
        if any(procs[i].exitcode == DISK_FULL_EXIT for i in failed):
            raise DiskFullError(storage_file(task.storage) or _shown_url(task.storage))
        if failed:
            raise CalibrationError(f"study worker(s) {failed} exited with codes {[procs[i].exitcode for i in failed]}")
    if _await_running(study, task.total_trials) and task.timeout is None:
        run_worker(task, progress=progress)  # trials of a worker that died were re-enqueued: run them here
    if progress is not None:
        complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        progress("study", complete, task.total_trials)
    return study


def wait_for_running(study: optuna.Study, *, timeout: float = 120.0, poll: float = 0.25) -> int:
    """Wait until no trial of the study is RUNNING (other workers finishing); returns how many still are.

    With heartbeats (RDB storages) a dead worker's trials are failed (and re-enqueued) once their
    grace period passes, so this returns as soon as live workers finish. Without (journal storages)
    a trial still running after ``timeout`` seconds is taken for a crashed worker's and ignored.
    """
    deadline = time.monotonic() + timeout  # only reached by trials that never recorded a heartbeat
    while True:
        fail_stale_trials(study)
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if running == 0 or time.monotonic() >= deadline:
            return running
        time.sleep(poll)


def _await_running(study: optuna.Study, total: int) -> bool:
    """The budget is taken but trials still run: wait for them; True when some came back to be run again."""
    wait_for_running(study)
    counted = study.get_trials(deepcopy=False, states=_COUNTED)
    return any(t.state == TrialState.WAITING for t in counted) or len(counted) < total


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
