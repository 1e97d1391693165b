"""KV scorers: each scores the stored positions of one layer from its keys, values and latest queries.

Scorers are named in `rift_ada.scorers.registry` (loaded without torch); the classes load lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "H2OScorer": "rift_ada.scorers.h2o",
    "SnapKVScorer": "rift_ada.scorers.snapkv",
    "ExpectedAttentionScorer": "rift_ada.scorers.expected_attention",
    "CriticalKVScorer": "rift_ada.scorers.criticalkv",
    "CurDKVScorer": "rift_ada.scorers.curdkv",
    "TriAttentionScorer": "rift_ada.scorers.triattention",
    "ScoreInputs": "rift_ada.scorers.inputs",
    "RopeRotation": "rift_ada.scorers.rope",
    "block_order_topk": "rift_ada.scorers.block",
    "select_topk": "rift_ada.scorers.topk",
    "SCORER_NAMES": "rift_ada.scorers.registry",
    "make_scorer": "rift_ada.scorers.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rift_ada.scorers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
