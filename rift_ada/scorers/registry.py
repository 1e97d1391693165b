"""The prefill scorers by name: the one place a ``scorer`` name (policy, CLI, controller JSON) is resolved.

Importing this module loads no torch: the controller validator reads the names from here.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

# name -> (module, class); the first is the default
SCORERS: dict[str, tuple[str, str]] = {
    "snapkv": ("rift_ada.scorers.snapkv", "SnapKVScorer"),
    "expected-attention": ("rift_ada.scorers.expected_attention", "ExpectedAttentionScorer"),
    "criticalkv": ("rift_ada.scorers.criticalkv", "CriticalKVScorer"),
    "curdkv": ("rift_ada.scorers.curdkv", "CurDKVScorer"),
    "triattention": ("rift_ada.scorers.triattention", "TriAttentionScorer"),
}
SCORER_NAMES: tuple[str, ...] = tuple(SCORERS)
DEFAULT_SCORER = SCORER_NAMES[0]


def check_scorer(name: object, field: str = "scorer") -> str:
    """``name`` if it is a registered scorer, else ValueError naming ``field`` and the valid names."""
    if name not in SCORERS:
        raise ValueError(f"{field}: unknown scorer {name!r}; valid scorers: {', '.join(SCORER_NAMES)}")
    return str(name)


def scorer_class(name: str) -> type:
    module, attribute = SCORERS[check_scorer(name)]
    return getattr(importlib.import_module(module), attribute)


def make_scorer(name: str, obs_window: int = 64, pool_kernel: int = 7) -> Any:
    """The scorer ``name`` with its default hyperparameters; SnapKV's window and pooling (also the base
    of CriticalKV) come from the cache policy."""
    snapkv = scorer_class("snapkv")(obs_window=obs_window, pool_kernel=pool_kernel)
    if name == "snapkv":
        return snapkv
    cls = scorer_class(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(base=snapkv) if "base" in fields else cls()
