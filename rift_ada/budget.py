"""Budget policies for the draft KV cache: how a budget B splits into a selection and a window.

Every policy keeps, for each KV head of each full-attention layer, a *selection* of at most k
positions plus a *window* of the r most recent positions (a query at position p sees the window
(p - r, p]), so the attended working set is exactly min(B, length) positions. How r and k are
set and the k chosen is the policy's selection (`rift_ada.selections`); this module is the
policies' names and fields (the controller JSON's ``cache`` block).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rift_ada.scorers.registry import DEFAULT_SCORER, SCORER_NAMES
from rift_ada.selections import H2O, AttentionSinks, BudgetError, FullKV, PrefillTopK, Selection, SlidingWindow, SnapKV

# policy name -> its selection (`rift_ada.selections`); the names are the controller JSON's ``cache.policy``
POLICY_SELECTIONS: dict[str, type[Selection]] = {
    "full": FullKV,
    "swa": SlidingWindow,
    "streamingllm": AttentionSinks,
    "h2o": H2O,
    "snapkv": SnapKV,
    "rift-stat": PrefillTopK,
    "rift-dyn": PrefillTopK,
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICY_SELECTIONS)

__all__ = ["POLICY_NAMES", "POLICY_SELECTIONS", "BudgetError", "CachePolicy", "make_policy", "validate"]


@dataclass(frozen=True)
class CachePolicy:
    """A draft-cache policy: budget split, how the selection is chosen and when it is rescored.

    ``name`` picks the selection (`POLICY_SELECTIONS`), which owns the window/selected split and
    how positions are chosen; the other fields are its hyperparameters. ``selection`` is that
    selection's kind: ``"prefix"`` (the first k positions: attention sinks, or everything for
    ``full``), ``"snapkv"`` (scored at prefill, rescored on ``refresh``) or ``"h2o"`` (accumulated
    attention, updated every step). ``scorer`` names the prefill scorer of a ``"snapkv"`` selection
    (`rift_ada.scorers.registry`: SnapKV, Expected Attention, CriticalKV, CurDKV, TriAttention);
    the ``snapkv`` policy is the fixed-window baseline of any scorer. ``refresh_interval``
    (RIFT-dyn's Δ) is the number of committed tokens between rescorings in the draft/verify loop;
    None means never.
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
    def selector(self) -> Selection:
        """The selection object this policy names, with this policy's hyperparameters."""
        return POLICY_SELECTIONS[self.name].from_policy(self)

    @property
    def is_full(self) -> bool:
        return self.selector.full

    @property
    def selection(self) -> str:
        return self.selector.kind

    @property
    def window(self) -> int:
        """r: positions of the sliding window (including the query itself)."""
        return self.selector.window

    @property
    def selected(self) -> int:
        """k: positions chosen outside the window (the sinks for StreamingLLM)."""
        return self.selector.selected

    def with_budget(self, budget: int) -> CachePolicy:
        return validate(replace(self, budget=budget))


def validate(policy: CachePolicy) -> CachePolicy:
    """Check a policy (the fields every budgeted selection reads, then the selection's own); raise BudgetError
    naming the field."""
    if policy.name not in POLICY_NAMES:
        raise BudgetError(f"unknown cache policy {policy.name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    if policy.scorer not in SCORER_NAMES:
        raise BudgetError(f"unknown scorer {policy.scorer!r}; valid scorers: {', '.join(SCORER_NAMES)}")
    selection = POLICY_SELECTIONS[policy.name]
    if policy.scorer != DEFAULT_SCORER and not selection.prefill_scored:
        scored = ", ".join(name for name, kind in POLICY_SELECTIONS.items() if kind.prefill_scored)
        raise BudgetError(f"scorer {policy.scorer!r} needs a prefill-scored policy ({scored}), got {policy.name!r}")
    if selection.full:
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
    policy.selector.validate()
    return policy


def make_policy(name: str, budget: int = 512, **fields: object) -> CachePolicy:
    """Build and validate a policy by name (``rift-dyn`` defaults to Δ = 128)."""
    if name not in POLICY_NAMES:
        raise BudgetError(f"unknown cache policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    if name == "rift-dyn" and fields.get("refresh_interval") is None:
        fields["refresh_interval"] = 128
    return validate(CachePolicy(name=name, budget=budget, **fields))  # type: ignore[arg-type]
