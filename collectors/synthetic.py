"""Synthetic probe traces with known structure, for tests and benchmarks without a model.

Each request walks through segments with a latent *staleness rate*: while it is high, a working
set loses quality quickly with age, so refreshing pays off. With ``planted="entropy"`` the draft
entropy rises exactly when the staleness rate is high (a signal a controller can find); with
``planted="none"`` every arm is equally good and refreshing never helps.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from rift_ada.collectors.probe_traces import ARM_FULL, ARM_STAT, ProbeTraces, age_arm

# Fixed, so that replay benchmarks and tests on synthetic traces keep their shape when the probe's
# default grid changes (the design's recommended grid).
SYNTHETIC_ARM_AGES: tuple[int, ...] = (0, 32, 64, 128, 256, 512, 768)


def synthetic_traces(
    n_requests: int = 100,
    osl: int = 4096,
    *,
    temperature: float = 0.0,
    arm_ages: tuple[int, ...] = SYNTHETIC_ARM_AGES,
    planted: Literal["entropy", "none"] = "entropy",
    seed: int = 0,
    draft_length: int = 11,
    decision_stride: int = 8,
    segment_length: int = 256,
    vary_length: bool = False,
) -> ProbeTraces:
    """Build probe traces of ``n_requests`` x (len(arm_ages) + 2) arms x ``osl`` positions."""
    rng = np.random.default_rng(seed)
    arms = tuple(age_arm(a) for a in arm_ages) + (ARM_STAT, ARM_FULL)
    n_arms = len(arms)
    positions = np.arange(osl)
    n_segments = -(-osl // segment_length)
    # Latent staleness rate per segment: mostly calm, sometimes a burst.
    hard = rng.random((n_requests, n_segments)) < 0.3
    rate_seg = np.where(hard, rng.uniform(1.5, 3.0, hard.shape), rng.uniform(0.0, 0.15, hard.shape))
    if planted == "none":
        rate_seg[:] = 0.0
    rate = np.repeat(rate_seg, segment_length, axis=1)[:, :osl]  # (R, P)
    full_quality = rng.uniform(0.85, 0.97, (n_requests, 1))

    ages = np.empty((n_arms, osl))
    for index, age in enumerate(arm_ages):
        ages[index] = age
    ages[-2] = positions + 512.0  # stat: the prefill selection only gets older
    ages[-1] = 0.0  # full: never stale
    quality = full_quality[:, None, :] * np.exp(-rate[:, None, :] * ages[None, :, :] / 1024.0)
    quality[:, -1, :] = full_quality  # full KV is the ceiling
    quality = np.clip(quality, 0.02, 0.995)

    if temperature == 0:
        # Common random numbers: a fresher arm matches wherever a staler one does.
        uniform = rng.random((n_requests, 1, osl))
        outcome = (uniform < quality).astype(np.float32)
    else:
        outcome = quality.astype(np.float32)

    base_entropy = rng.uniform(0.3, 0.8, (n_requests, 1, 1))
    noise = rng.normal(0.0, 0.15, (n_requests, n_arms, osl))
    if planted == "entropy":
        entropy = base_entropy + 1.2 * rate[:, None, :] + noise
    else:
        entropy = base_entropy + noise + 0.5 * rng.random((n_requests, 1, osl))
    entropy = np.maximum(entropy, 0.0).astype(np.float32)

    n_strides = -(-osl // decision_stride)
    stride_rate = rate[:, ::decision_stride][:, :n_strides]
    stride_ages = ages[:, ::decision_stride][:, :n_strides]
    drift = 1.0 - np.exp(-(0.05 + stride_rate[:, None, :]) * stride_ages[None] / 2048.0)
    drift = drift + rng.normal(0.0, 0.01, drift.shape)
    retained = np.exp(-(0.1 + stride_rate[:, None, :]) * stride_ages[None] / 1024.0)
    retained[:, -1, :] = 1.0
    stride_signals = {
        "query_drift": np.clip(drift, 0.0, 2.0).astype(np.float32),
        "retained_mass": np.clip(retained, 0.0, 1.0).astype(np.float32),
    }

    lengths = np.full(n_requests, osl, dtype=np.int64)
    if vary_length:
        lengths = rng.integers(osl // 2, osl + 1, n_requests)
        mask = positions[None, :] >= lengths[:, None]
        outcome[np.broadcast_to(mask[:, None, :], outcome.shape)] = np.nan
        entropy[np.broadcast_to(mask[:, None, :], entropy.shape)] = np.nan
        stride_mask = (np.arange(n_strides) * decision_stride)[None, :] >= lengths[:, None]
        for array in stride_signals.values():
            array[np.broadcast_to(stride_mask[:, None, :], array.shape)] = np.nan

    categories = np.array(["code", "writing", "qa", "summary"])[rng.integers(0, 4, n_requests)]
    requests = {
        "request_id": np.array([f"synthetic-{i:05d}" for i in range(n_requests)]),
        "dataset": np.array(["synthetic"] * n_requests),
        "category": categories,
        "tier": np.where(np.isin(categories, ["code", "qa"]), "low", "high"),
        "isl": rng.choice([1024, 2048, 4096], n_requests).astype(np.int64),
        "osl": lengths,
    }
    manifest = {
        "format": "rift-ada.traces",
        "version": 1,
        "mode": "probe",
        "draft": "synthetic",
        "target": "synthetic",
        "temperature": float(temperature),
        "seed": int(seed),
        "draft_length": draft_length,
        "decision_stride": decision_stride,
        "arms": list(arms),
        "dataset": "synthetic",
        "n_requests": n_requests,
        "synthetic": {"planted": planted, "osl": osl, "segment_length": segment_length},
    }
    return ProbeTraces(
        requests=requests,
        arms=arms,
        outcome=outcome,
        entropy=entropy,
        stride_signals=stride_signals,
        temperature=float(temperature),
        draft_length=draft_length,
        decision_stride=decision_stride,
        manifest=manifest,
    )
