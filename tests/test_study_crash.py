"""A calibration worker killed by SIGKILL leaves no trial RUNNING for ever: a rerun fails and retries them."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace

import optuna
from optuna.trial import TrialState
from test_study_workers import _task

from rift_ada.calibrate.study import BASELINE_ATTR, open_storage, run_study

# Runs the study and kills itself (SIGKILL: no cleanup, no `tell`) in the middle of its third batch.
KILLED_WORKER = """
import os, pathlib, pickle, signal, sys
from rift_ada.calibrate.study import run_study
task = pickle.loads(pathlib.Path(sys.argv[1]).read_bytes())
evaluate, calls = task.evaluator.evaluate_many, []
def evaluate_then_die(policies):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return evaluate(policies)
task.evaluator.evaluate_many = evaluate_then_die
run_study(task)
"""


def test_rerun_after_sigkill_completes_exactly_the_budget(tmp_path):
    task = replace(_task(f"sqlite:///{tmp_path / 'study.db'}", n_trials=30), heartbeat_interval=1, grace_period=2)
    (tmp_path / "task.pkl").write_bytes(pickle.dumps(task))
    killed = subprocess.run([sys.executable, "-c", KILLED_WORKER, str(tmp_path / "task.pkl")], timeout=300)
    assert killed.returncode == -signal.SIGKILL
    storage = open_storage(task.storage)
    before = optuna.load_study(study_name=task.study_name, storage=storage).get_trials(deepcopy=False)
    running = [t for t in before if t.state == TrialState.RUNNING]
    assert len(running) == task.batch_size  # the killed batch is left RUNNING

    start = time.monotonic()
    run_study(task)
    rerun_s = time.monotonic() - start
    study = optuna.load_study(study_name=task.study_name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) == task.total_trials
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert sorted(t.number for t in failed) == sorted(t.number for t in running)  # exactly the killed trials
    # Each killed trial was retried once, with its parameters and labels (a baseline stays that baseline).
    retries = {t.system_attrs["failed_trial"]: t for t in trials if "failed_trial" in t.system_attrs}
    assert set(retries) == {t.number for t in running}
    for original in running:
        retry = retries[original.number]
        assert retry.state == TrialState.COMPLETE and retry.params == original.params
        assert retry.user_attrs.get(BASELINE_ATTR) == original.user_attrs.get(BASELINE_ATTR)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    baselines = [t.user_attrs[BASELINE_ATTR] for t in complete if BASELINE_ATTR in t.user_attrs]
    assert sorted(baselines) == sorted(task.baselines)
    assert rerun_s < 30  # one grace period (2 s) plus the work, not a 120 s wait


def test_a_trial_killed_right_after_ask_still_goes_stale(tmp_path):
    """The first heartbeat is written with the RUNNING trial itself, not after ``ask`` returns."""
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    asked = study.ask()
    asked.suggest_float("x", 0.0, 1.0)  # as if the worker died here, before recording any heartbeat
    time.sleep(2.5)
    optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].params == trials[0].params and trials[1].system_attrs["failed_trial"] == asked.number


def _outcome(task) -> list[tuple]:
    """(label, params, values) of every COMPLETE trial, in label order: what the operating point is chosen from."""
    study = optuna.load_study(study_name=task.study_name, storage=open_storage(task.storage))
    rows = [
        (t.user_attrs.get(BASELINE_ATTR) or t.user_attrs["rift_ada"]["label"], sorted(t.params.items()), t.values)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ]
    return sorted(rows, key=lambda row: row[0])


# Raises inside its third batch's evaluation (a SIGTERM unwinding, a full disk in replay's output).
FAILING_WORKER = KILLED_WORKER.replace("os.kill(os.getpid(), signal.SIGKILL)", "raise OSError(28, 'injected')")


def test_a_rerun_after_a_fault_inside_the_study_samples_what_an_uninterrupted_run_samples(tmp_path):
    reference = replace(_task(f"sqlite:///{tmp_path / 'ref.db'}", n_trials=30), heartbeat_interval=1, grace_period=2)
    run_study(reference)
    expected = _outcome(reference)
    assert len(expected) == reference.total_trials
    for name, worker in (("killed", KILLED_WORKER), ("failed", FAILING_WORKER)):
        task = replace(reference, storage=f"sqlite:///{tmp_path / (name + '.db')}")
        (tmp_path / "task.pkl").write_bytes(pickle.dumps(task))
        faulted = subprocess.run([sys.executable, "-c", worker, str(tmp_path / "task.pkl")], timeout=300)
        assert faulted.returncode != 0
        run_study(task)
        assert _outcome(task) == expected, name


def test_a_running_trial_that_never_beat_goes_stale(tmp_path):
    """A RUNNING trial with no heartbeat row at all (its first heartbeat lost to a full disk) is failed once this
    process has seen it unbeaten for a grace period, and re-enqueued with its parameters; a beating one is not."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    plain = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)  # records no heartbeat on ask
    dead = optuna.create_study(storage=plain, study_name="s").ask()
    dead.suggest_float("x", 0.0, 1.0)
    storage = open_storage(url, heartbeat_interval=1, grace_period=1)
    study = optuna.load_study(study_name="s", storage=storage)
    live = study.ask()  # beats at creation
    optuna.storages.fail_stale_trials(study)  # first sight of the unbeaten trial: not yet stale
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.RUNNING, TrialState.RUNNING]
    time.sleep(1.5)
    storage.record_heartbeat(live._trial_id)
    optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    assert trials[2].params == trials[0].params and trials[2].system_attrs["failed_trial"] == dead.number
