"""KV scorers: each takes (queries, keys) tensors directly and returns per-KV-head position scores."""

from rift_ada.scorers.block import block_order_topk
from rift_ada.scorers.h2o import H2OScorer
from rift_ada.scorers.snapkv import SnapKVScorer
from rift_ada.scorers.topk import select_topk

__all__ = ["H2OScorer", "SnapKVScorer", "block_order_topk", "select_topk"]
