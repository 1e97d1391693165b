"""Periodic refresh (RIFT-dyn as a controller policy): replay lanes and rendering of the ``periodic`` kind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rift_ada.policies.kind_tools import KindTools, LaneParams
from rift_ada.policy_kinds import Periodic

if TYPE_CHECKING:
    from rich.tree import Tree

__all__ = ["PeriodicLanes", "PeriodicTools"]


class PeriodicLanes:
    """Fires where the lane's age reaches its policy's interval."""

    def __init__(self, policies: Sequence[Periodic], lanes_per_policy: int) -> None:
        self.params = LaneParams(lanes_per_policy)
        self._interval = self.params.add([p.interval for p in policies])

    def fires(self, signals: Mapping[str, np.ndarray], age: np.ndarray, lanes: slice) -> np.ndarray:
        return np.greater_equal(age[lanes], self.params.values[self._interval])

    def keep(self, mask: np.ndarray) -> None:
        self.params.keep(mask)


class PeriodicTools(KindTools):
    kind = Periodic

    @staticmethod
    def skeleton(policy: Periodic) -> tuple:
        return ("periodic",)

    @staticmethod
    def lanes(policies: Sequence[Periodic], lanes_per_policy: int) -> PeriodicLanes:
        return PeriodicLanes(policies, lanes_per_policy)

    @staticmethod
    def oldest_age(policy: Periodic, schedule: Mapping[str, int]) -> int:
        return min(int(schedule["max_age"]), max(policy.interval, int(schedule["min_age"])))

    @staticmethod
    def render(policy: Periodic, tree: Tree) -> None:
        tree.add(f"refresh when age >= {policy.interval}")
