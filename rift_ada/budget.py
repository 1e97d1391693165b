"""Budget policies for the draft KV cache: how a budget B splits into a selection and a window.

Every policy keeps, for each KV head of each full-attention layer, a *selection* of at most k
positions plus a *window* of the r most recent positions (a query at position p sees the window
(p - r, p]), so the attended working set is exactly min(B, length) positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rift_ada.scorers.registry import DEFAULT_SCORER, SCORER_NAMES

POLICY_NAMES: tuple[str, ...] = ("full", "swa", "streamingllm", "h2o", "snapkv", "rift-stat", "rift-dyn")


class BudgetError(ValueError):
    """A cache policy or budget that cannot work (names the field)."""


@dataclass(frozen=True)
class CachePolicy:
    """A draft-cache policy: budget split, how the selection is chosen and when it is rescored.

    ``selection`` is ``"prefix"`` (the first k positions: attention sinks, or everything for
    ``full``), ``"snapkv"`` (SnapKV scores at prefill, rescored on ``refresh``) or ``"h2o"``
    (accumulated attention, updated every step). ``scorer`` names the prefill scorer of a
    ``"snapkv"`` selection (`rift_ada.scorers.registry`: SnapKV, Expected Attention, CriticalKV,
    CurDKV, TriAttention); the ``snapkv`` policy is the fixed-window baseline of any scorer.
    ``refresh_interval`` (RIFT-dyn's Δ) is the number of committed tokens between rescorings in
    the draft/verify loop; None means never.
    """

    name: str = "rift-stat"
    budget: int = 512
    sw_ratio: float = 0.5
    obs_window: int = 64
    pool_kernel: int = 7
    block_size: int | None = None
    sinks: int = 4
    refresh_interval: int | None = None
    scorer: str = DEFAULT_SCORER

    @property
    def is_full(self) -> bool:
        return self.name == "full"

    @property
    def selection(self) -> str:
        if self.name in ("full", "swa", "streamingllm"):
            return "prefix"
        if self.name == "h2o":
            return "h2o"
        return "snapkv"

    @property
    def window(self) -> int:
        """r: positions of the sliding window (including the query itself)."""
        if self.is_full:
            return 0
        if self.name == "swa":
            return self.budget
        if self.name == "streamingllm":
            return self.budget - self.sinks
        if self.name == "snapkv":
            return self.obs_window
        return max(1, int(self.sw_ratio * self.budget))

    @property
    def selected(self) -> int:
        """k: positions chosen outside the window (the sinks for StreamingLLM)."""
        if self.is_full:
            return 1 << 62
        return self.budget - self.window

    @property
    def scored(self) -> bool:
        return self.selection in ("snapkv", "h2o")

    def with_budget(self, budget: int) -> CachePolicy:
        return validate(replace(self, budget=budget))


def validate(policy: CachePolicy) -> CachePolicy:
    """Check a policy; raise BudgetError naming the field."""
    if policy.name not in POLICY_NAMES:
        raise BudgetError(f"unknown cache policy {policy.name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    if policy.scorer not in SCORER_NAMES:
        raise BudgetError(f"unknown scorer {policy.scorer!r}; valid scorers: {', '.join(SCORER_NAMES)}")
    if policy.scorer != DEFAULT_SCORER and policy.selection != "snapkv":
        raise BudgetError(
            f"scorer {policy.scorer!r} needs a prefill-scored policy (snapkv, rift-stat, rift-dyn), got {policy.name!r}"
        )
    if policy.is_full:
        return policy
    if not isinstance(policy.budget, int) or policy.budget < 1:
        raise BudgetError(f"budget must be a positive integer, got {policy.budget!r}")
    if not (0.0 < policy.sw_ratio <= 1.0):
        raise BudgetError(f"sw_ratio must lie in (0, 1], got {policy.sw_ratio!r}")
    if policy.obs_window < 1:
        raise BudgetError(f"obs_window must be >= 1, got {policy.obs_window!r}")
    if policy.pool_kernel < 1 or policy.pool_kernel % 2 == 0:
        raise BudgetError(f"pool_kernel must be a positive odd integer, got {policy.pool_kernel!r}")
    if policy.block_size is not None and policy.block_size < 1:
        raise BudgetError(f"block_size must be >= 1 or None, got {policy.block_size!r}")
    if policy.refresh_interval is not None and policy.refresh_interval < 1:
        raise BudgetError(f"refresh_interval must be >= 1 or None, got {policy.refresh_interval!r}")
    if policy.scored and policy.budget < policy.obs_window:
        raise BudgetError(
            f"budget {policy.budget} is smaller than the observation window obs_window={policy.obs_window}: "
            "scored policies need B >= w"
        )
    if policy.name == "streamingllm" and policy.budget <= policy.sinks:
        raise BudgetError(f"budget {policy.budget} must exceed the {policy.sinks} attention sinks")
    if policy.name == "snapkv" and policy.budget <= policy.obs_window:
        raise BudgetError(f"snapkv needs budget > obs_window ({policy.obs_window}), got {policy.budget}")
    return policy


def make_policy(name: str, budget: int = 512, **fields: object) -> CachePolicy:
    """Build and validate a policy by name (``rift-dyn`` defaults to Δ = 128)."""
    if name not in POLICY_NAMES:
        raise BudgetError(f"unknown cache policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    if name == "rift-dyn" and fields.get("refresh_interval") is None:
        fields["refresh_interval"] = 128
    return validate(CachePolicy(name=name, budget=budget, **fields))  # type: ignore[arg-type]
