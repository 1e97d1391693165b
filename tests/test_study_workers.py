"""Several worker processes filling one Optuna study through a shared storage."""

from __future__ import annotations

import errno
import pickle
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import optuna
import pytest
from optuna.trial import TrialState

from rift_ada.atomic import DiskFullError
from rift_ada.calibrate.export import DEFAULT_CACHE, DEFAULT_SCHEDULE, DEFAULT_SIGNALS
from rift_ada.calibrate.grids import threshold_grids
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.calibrate.study import (
    BASELINE_ATTR,
    RECORD_ATTR,
    PolicyEvaluator,
    StudyTask,
    baseline_labels,
    open_storage,
    run_study,
    run_worker,
)
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.policies.space import SearchSpace

N_SEARCH = 40
# A worker on "another machine": loads the task, waits until both workers are up, then fills the study.
WORKER_SCRIPT = """
import pathlib, pickle, sys, time
from rift_ada.calibrate.study import run_worker
task = pickle.loads(pathlib.Path(sys.argv[1]).read_bytes())
folder = pathlib.Path(sys.argv[1]).parent
(folder / f"ready{sys.argv[2]}").touch()
deadline = time.monotonic() + 60
while len(list(folder.glob("ready*"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
run_worker(task, worker_index=int(sys.argv[2]), parallel=True)
"""


def _task(storage: str, *, n_trials: int = N_SEARCH, study_name: str = "shared", grids=None) -> StudyTask:
    traces = synthetic_traces(16, 512, seed=11)
    if grids is None:
        grids = dict(threshold_grids(traces).values)
    fields = {
        "name": "w",
        "draft": "synthetic",
        "target": "synthetic",
        "temperature": 0.0,
        "cache": dict(DEFAULT_CACHE),
        "schedule": dict(DEFAULT_SCHEDULE),
        "signals": dict(DEFAULT_SIGNALS),
    }
    return StudyTask(
        storage=storage,
        study_name=study_name,
        n_trials=n_trials,
        seed=3,
        space=SearchSpace(grids=grids, families=("gate",)),
        evaluator=PolicyEvaluator(traces, fields),
        baselines=tuple(baseline_labels((32, 128), 128)),
    )


def _check_study(task: StudyTask, *, expect_workers: int) -> None:
    study = optuna.load_study(study_name=task.study_name, storage=open_storage(task.storage))
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == task.total_trials  # none lost, none extra
    assert len({t.number for t in trials}) == len(trials)  # trial numbers are distinct
    # Anything not complete is a budget overshoot that was never run.
    assert all(t.user_attrs.get("skipped") for t in trials if t.state != TrialState.COMPLETE)
    baselines = Counter(t.user_attrs.get(BASELINE_ATTR) for t in complete if t.user_attrs.get(BASELINE_ATTR))
    assert baselines == Counter(task.baselines)  # every baseline exactly once
    workers = Counter(t.user_attrs[RECORD_ATTR]["worker"] for t in complete)
    assert len(workers) == expect_workers, workers
    params = [tuple(sorted(t.params.items())) for t in complete if t.params]
    assert len(params) == task.n_trials
    # Seeded apart, the searching workers draw their own policies. (TPE may repeat a policy within a
    # worker on this small grid, so how many are distinct overall depends on the interleaving.)
    by_worker: dict[int, list[tuple]] = {}
    for trial in sorted(complete, key=lambda t: t.number):
        if trial.params:
            worker = trial.user_attrs[RECORD_ATTR]["worker"]
            by_worker.setdefault(worker, []).append(tuple(sorted(trial.params.items())))
    openings = [tuple(drawn[:3]) for drawn in by_worker.values()]
    assert len(set(openings)) == len(openings), by_worker


def test_two_processes_fill_one_sqlite_study(tmp_path):
    task = _task(f"sqlite:///{tmp_path / 'study.db'}")
    run_study(task, workers=2)
    _check_study(task, expect_workers=2)


class _DiskFullEvaluator(PolicyEvaluator):
    """Replay as a worker whose disk filled mid-study sees it (module level: spawned workers unpickle it)."""

    def evaluate_many(self, policies):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_inside_a_worker_process_is_the_full_disk_error(tmp_path, capfd):
    """Not "worker(s) exited with codes [1, 1]" and two tracebacks: the one full-disk error naming the storage."""
    task = _task(f"sqlite:///{tmp_path / 'study.db'}", n_trials=8)
    task = replace(task, evaluator=_DiskFullEvaluator(task.evaluator.traces, task.evaluator.controller_fields))
    with pytest.raises(DiskFullError) as caught:
        run_study(task, workers=2)
    assert caught.value.filename == str(tmp_path / "study.db")
    assert "Traceback" not in capfd.readouterr().err


def test_two_independent_processes_share_a_journal_file(tmp_path):
    task = _task(f"journal:{tmp_path / 'study.log'}", n_trials=60)
    run_study(_task(task.storage, n_trials=0))  # create the study and run the baselines first
    blob = tmp_path / "task.pkl"
    blob.write_bytes(pickle.dumps(task))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(blob), str(i + 1)]) for i in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    _check_study(task, expect_workers=3)  # worker 0 ran the baselines, workers 1 and 2 the search


def test_full_study_takes_no_more_trials(tmp_path):
    task = _task(f"sqlite:///{tmp_path / 'study.db'}", n_trials=5)
    run_study(task)
    assert run_worker(task) == 0
    more = _task(task.storage, n_trials=8)  # a larger budget extends the same study
    assert run_worker(more) == 3
    study = optuna.load_study(study_name="shared", storage=open_storage(task.storage))
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == more.total_trials


def test_study_built_from_other_inputs_is_refused(tmp_path):
    task = _task(f"sqlite:///{tmp_path / 'study.db'}", n_trials=2)
    run_study(task)
    other = _task(task.storage, n_trials=2, grids={"entropy": (0.5, 1.0)})
    with pytest.raises(CalibrationError, match=r"built from different traces"):
        run_study(other)


def test_storage_urls():
    with pytest.raises(CalibrationError, match=r"not a URL"):
        open_storage("study.db")
    assert isinstance(open_storage("sqlite:///:memory:"), optuna.storages.RDBStorage)
