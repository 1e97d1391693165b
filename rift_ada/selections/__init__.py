"""Cache selections, one module per kind: which positions a budgeted layer keeps besides its window.

`rift_ada.budget.CachePolicy` names one (its ``name``) and `rift_ada.cache.BudgetedLayer` stores the KV
and delegates choosing to it. Prefix (full KV, sliding window, StreamingLLM sinks), prefill-scored
top-k (RIFT-stat / RIFT-dyn, any registered scorer, token or block granularity), SnapKV's own split,
H2O heavy hitters.
"""

from rift_ada.selections.base import BudgetError, Selection, prefix_positions
from rift_ada.selections.h2o import H2O
from rift_ada.selections.prefix import AttentionSinks, FullKV, PrefixSelection, SlidingWindow
from rift_ada.selections.scored import ScoredSelection
from rift_ada.selections.snapkv import SnapKV
from rift_ada.selections.topk import PrefillTopK

__all__ = [
    "H2O",
    "AttentionSinks",
    "BudgetError",
    "FullKV",
    "PrefillTopK",
    "PrefixSelection",
    "ScoredSelection",
    "Selection",
    "SlidingWindow",
    "SnapKV",
    "prefix_positions",
]
