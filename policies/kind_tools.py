"""The policies side of a policy kind: what replay, search and rendering need beyond the runtime kind.

Each kind module of policies/ (``periodic.py``, ``gate.py``, ``score.py``) defines one
:class:`KindTools` subclass, registered in :mod:`rift_ada.policies.kinds` beside the runtime
kinds of :mod:`rift_ada.policy_kinds`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from rift_ada.policy_kinds import PolicyKind

if TYPE_CHECKING:
    from rich.tree import Tree

    from rift_ada.policies.space import SearchSpace, TrialLike

__all__ = ["KindTools", "LaneParams", "Lanes"]


class Lanes(Protocol):
    """Replay's vectorised decision of a batch of policies of one kind and skeleton."""

    def fires(self, signals: Mapping[str, np.ndarray], age: np.ndarray, lanes: slice) -> np.ndarray:
        """Whether each lane in ``lanes`` fires, given every lane's signal arrays and ages."""
        ...

    def keep(self, mask: np.ndarray) -> None:
        """Drop the lanes (of this batch) where ``mask`` is False."""
        ...


class LaneParams:
    """Numbers of a run of lanes: a float shared by all lanes, or one value (row) per lane.

    Evaluators read ``values[i]`` at call time, so dropping finished lanes (:meth:`keep`) is seen
    by every closure built over this object.
    """

    def __init__(self, n_requests: int) -> None:
        self.n_requests = n_requests
        self.values: list[Any] = []

    def add(self, per_policy: Sequence[Any]) -> int:
        """Register one number (or row) per policy; returns its index in ``values``."""
        first = per_policy[0]
        if all(np.array_equal(v, first) for v in per_policy):
            value = float(first) if np.ndim(first) == 0 else np.asarray(first, dtype=np.float64)[None, :]
        else:
            value = np.repeat(np.asarray(per_policy, dtype=np.float64), self.n_requests, axis=0)
        self.values.append(value)
        return len(self.values) - 1

    def keep(self, mask: np.ndarray) -> None:
        """Drop the lanes where ``mask`` is False (in place, for the closures)."""
        self.values[:] = [v[mask] if isinstance(v, np.ndarray) and len(v) == len(mask) else v for v in self.values]


class KindTools(ABC):
    """Replay lanes, search-space suggestion and rendering of one runtime kind (``kind``).

    Used as a class (its methods are static or class methods); :mod:`rift_ada.policies.kinds` refuses to
    register one that leaves an abstract method unimplemented.
    """

    kind: ClassVar[type[PolicyKind]]
    searched: ClassVar[bool] = False  # a family of the calibration search (SearchSpace.families)

    @staticmethod
    @abstractmethod
    def skeleton(policy: Any) -> tuple:
        """Structure of a policy without its numbers: policies sharing it are evaluated together."""

    @staticmethod
    @abstractmethod
    def lanes(policies: Sequence[Any], lanes_per_policy: int) -> Lanes:
        """Lanes of policies sharing a skeleton (``lanes_per_policy`` consecutive lanes each)."""

    @staticmethod
    def oldest_age(policy: Any, schedule: Mapping[str, int]) -> int:
        """The oldest working-set age a controller of this policy can hold before its refresh."""
        return int(schedule["max_age"])

    @staticmethod
    @abstractmethod
    def render(policy: Any, tree: Tree) -> None:
        """Add the policy's rule lines under ``tree`` (``rift-ada show``)."""

    @staticmethod
    def searchable(space: SearchSpace) -> bool:
        """Whether ``space`` holds something to search for this kind."""
        return False

    @classmethod
    def suggest(cls, space: SearchSpace, trial: TrialLike) -> dict[str, Any]:
        """One policy object of this kind sampled from ``space`` (searched kinds override it)."""
        raise TypeError(f"policy kind {cls.kind.kind!r} is not a family of the calibration search")
