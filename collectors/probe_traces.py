"""In-memory probe traces: the contract between collection, replay and calibration.

A probe collection teacher-forces a fixed target response through the draft once and records,
for every output position and every *arm*, what a speculative round would see there. Arms are
working-set ages on a grid (``age:0``, ``age:32``, ...: the selection was refreshed that many
tokens before the position's stride), plus ``stat`` (never refreshed after prefill) and ``full``
(no compression). Arrays are padded to the longest response with NaN; ``osl`` gives the true
length of each request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

ARM_STAT = "stat"
ARM_FULL = "full"
# The design's recommended grid (0, 32, ..., 768) plus 8 and 16: a draft's AL falls fastest in the first
# strides after a refresh, so interpolating between the 0 and 32 arms read young working sets several
# percent too high (docs/notes/2026-11-29-replay-fidelity.md, "Which arm grid").
DEFAULT_ARM_AGES: tuple[int, ...] = (0, 8, 16, 32, 64, 128, 256, 512, 768)
REQUEST_COLUMNS: tuple[str, ...] = ("request_id", "dataset", "category", "tier", "isl", "osl")
STRIDE_SIGNALS: tuple[str, ...] = ("query_drift", "retained_mass")


def age_arm(age: int) -> str:
    """Name of the arm whose working set was refreshed ``age`` tokens ago."""
    return f"age:{int(age)}"


def arm_age(arm: str) -> int | None:
    """Age of an ``age:N`` arm, or None for ``stat`` / ``full``."""
    if arm.startswith("age:"):
        return int(arm[4:])
    if arm in (ARM_STAT, ARM_FULL):
        return None
    raise ValueError(f"unknown arm name {arm!r}: expected 'age:N', {ARM_STAT!r} or {ARM_FULL!r}")


@dataclass
class ProbeTraces:
    """Probe outcomes for R requests, A arms and up to P output positions (S = ceil(P / stride)).

    ``outcome[r, a, p]``: T = 0, 1.0 if the draft's greedy token at output position p (teacher
    forced on the target prefix) equals the target token, else 0.0; T > 0, the acceptance
    probability sum_x min(p_target(x), q_draft(x)) at that position.
    ``token_acceptance[r, a, p]`` (T > 0; None in traces that lack it): the probability that the
    draft position is accepted *given the text's token* x there, min(1, q_draft(x) / p_target(x)).
    In the free-running loop, given its committed text, each drafted position is accepted with
    exactly this probability, independently (docs/notes/2026-11-29-replay-fidelity.md, "Acceptance given the text"), so
    replay samples it rather than ``outcome``, whose mean over x ~ p it is. See :attr:`acceptance`.
    ``entropy[r, a, p]``: draft entropy (nats) at that position.
    ``stride_signals[name][r, a, s]``: per-stride signals measured under the arm (``query_drift``
    relative to the arm's last refresh, ``retained_mass``), for stride s covering positions
    [s * stride, (s + 1) * stride).
    """

    requests: dict[str, np.ndarray]
    arms: tuple[str, ...]
    outcome: np.ndarray
    entropy: np.ndarray
    stride_signals: dict[str, np.ndarray]
    temperature: float
    draft_length: int = 11
    decision_stride: int = 8
    manifest: dict[str, Any] = field(default_factory=dict)
    token_acceptance: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.arms = tuple(self.arms)
        for name in self.arms:
            arm_age(name)
        n_req = len(self.requests["request_id"])
        for column in REQUEST_COLUMNS:
            if column not in self.requests:
                raise ValueError(f"probe traces: missing request column {column!r}")
            if len(self.requests[column]) != n_req:
                raise ValueError(f"probe traces: request column {column!r} has the wrong length")
        expected = (n_req, len(self.arms))
        for label, array in (("outcome", self.outcome), ("entropy", self.entropy)):
            if array.ndim != 3 or array.shape[:2] != expected:
                raise ValueError(f"probe traces: {label} has shape {array.shape}, expected {expected} + (P,)")
        if self.outcome.shape != self.entropy.shape:
            raise ValueError("probe traces: outcome and entropy shapes differ")
        if self.token_acceptance is not None and self.token_acceptance.shape != self.outcome.shape:
            raise ValueError(
                f"probe traces: token_acceptance has shape {self.token_acceptance.shape}, expected {self.outcome.shape}"
            )
        n_strides = -(-self.outcome.shape[2] // self.decision_stride)
        for name, array in self.stride_signals.items():
            if array.shape != (*expected, n_strides):
                raise ValueError(
                    f"probe traces: stride signal {name!r} has shape {array.shape}, expected {(*expected, n_strides)}"
                )

    @property
    def n_requests(self) -> int:
        return len(self.requests["request_id"])

    @property
    def osl(self) -> np.ndarray:
        return np.asarray(self.requests["osl"], dtype=np.int64)

    def arm_index(self, arm: str) -> int:
        try:
            return self.arms.index(arm)
        except ValueError:
            raise KeyError(f"arm {arm!r} not in traces (have {', '.join(self.arms)})") from None

    @property
    def acceptance(self) -> np.ndarray:
        """(R, A, P) probability that a drafted position is accepted, as replay walks it: T = 0 the
        match bit; T > 0 ``token_acceptance`` where recorded, else ``outcome`` (older traces)."""
        if self.temperature > 0 and self.token_acceptance is not None:
            return self.token_acceptance
        return self.outcome

    @property
    def age_grid(self) -> np.ndarray:
        """Sorted ages of the ``age:N`` arms."""
        return np.array(sorted(a for a in (arm_age(n) for n in self.arms) if a is not None), dtype=np.int64)

    def with_age_grid(self, ages: list[int] | tuple[int, ...]) -> ProbeTraces:
        """Traces with only the ``age:N`` arms of ``ages`` (in that order) and every other arm (``stat``,
        ``full``): replay of a sparser age grid on the same probe."""
        arms = [age_arm(age) for age in ages] + [name for name in self.arms if arm_age(name) is None]
        idx = np.array([self.arm_index(arm) for arm in arms], dtype=np.int64)
        return ProbeTraces(
            requests=dict(self.requests),
            arms=tuple(arms),
            outcome=self.outcome[:, idx],
            entropy=self.entropy[:, idx],
            stride_signals={k: v[:, idx] for k, v in self.stride_signals.items()},
            temperature=self.temperature,
            draft_length=self.draft_length,
            decision_stride=self.decision_stride,
            manifest=dict(self.manifest),
            token_acceptance=None if self.token_acceptance is None else self.token_acceptance[:, idx],
        )

    def subset(self, indices: np.ndarray | list[int]) -> ProbeTraces:
        """Traces restricted to the given request indices (order kept)."""
        idx = np.asarray(indices, dtype=np.int64)
        return ProbeTraces(
            requests={k: np.asarray(v)[idx] for k, v in self.requests.items()},
            arms=self.arms,
            outcome=self.outcome[idx],
            entropy=self.entropy[idx],
            stride_signals={k: v[idx] for k, v in self.stride_signals.items()},
            temperature=self.temperature,
            draft_length=self.draft_length,
            decision_stride=self.decision_stride,
            manifest=dict(self.manifest),
            token_acceptance=None if self.token_acceptance is None else self.token_acceptance[idx],
        )
