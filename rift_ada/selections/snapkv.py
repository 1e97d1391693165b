"""SnapKV's own split (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before Generation"):
the observation window itself is the recent window (r = obs_window), the rest of the budget is the scorer's
top-k; the fixed-window baseline of any prefill scorer."""

from __future__ import annotations

import dataclasses

from rift_ada.selections.base import BudgetError
from rift_ada.selections.topk import PrefillTopK


@dataclasses.dataclass(frozen=True)
class SnapKV(PrefillTopK):
    """`PrefillTopK` with a window of ``obs_window`` positions."""

    @property
    def window(self) -> int:
        return self.obs_window

    def validate(self) -> None:
        super().validate()
        if self.budget <= self.obs_window:
            raise BudgetError(f"snapkv needs budget > obs_window ({self.obs_window}), got {self.budget}")
