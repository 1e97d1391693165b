"""Cache selections (`rift_ada.selections`): the split each policy name gets, its own checks, and the layer's
delegation to it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import tiny_model

from rift_ada.budget import POLICY_NAMES, POLICY_SELECTIONS, BudgetError, make_policy
from rift_ada.cache import make_draft_cache
from rift_ada.selections import H2O, FullKV, PrefillTopK, Selection, SnapKV
from rift_ada.speculative import forward_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# B = 100, sw_ratio 0.3, obs_window 16, sinks 4: (kind, window r, selected k) per policy name
SPLITS = {
    "full": ("prefix", 0, 1 << 62),
    "swa": ("prefix", 100, 0),
    "streamingllm": ("prefix", 96, 4),
    "h2o": ("h2o", 30, 70),
    "snapkv": ("snapkv", 16, 84),
    "rift-stat": ("snapkv", 30, 70),
    "rift-dyn": ("snapkv", 30, 70),
}


def test_each_policy_name_gets_its_selection_and_split():
    assert tuple(SPLITS) == POLICY_NAMES == tuple(POLICY_SELECTIONS)
    for name, (kind, window, selected) in SPLITS.items():
        policy = make_policy(name, budget=100, sw_ratio=0.3, obs_window=16)
        selection = policy.selector
        assert isinstance(selection, POLICY_SELECTIONS[name]) and selection.budget == 100
        assert (policy.selection, policy.window, policy.selected) == (kind, window, selected), name
        assert policy.is_full == (name == "full")
    assert make_policy("h2o", budget=100, block_size=4).selector == H2O(100, 0.5, 64, 4)  # the fields it reads


def test_a_selection_checks_its_own_split_naming_the_field():
    with pytest.raises(BudgetError, match="budget 4 must exceed the 4 attention sinks"):
        make_policy("streamingllm", budget=4)
    with pytest.raises(BudgetError, match=r"snapkv needs budget > obs_window \(64\), got 64"):
        make_policy("snapkv", budget=64)
    with pytest.raises(BudgetError, match="smaller than the observation window obs_window=64"):
        make_policy("h2o", budget=32)
    with pytest.raises(BudgetError, match=r"needs a prefill-scored policy \(snapkv, rift-stat, rift-dyn\)"):
        make_policy("h2o", scorer="criticalkv")
    assert SnapKV.prefill_scored and PrefillTopK.prefill_scored and not H2O.prefill_scored
    make_policy("full", budget=0)  # full KV has no budget to check


@dataclasses.dataclass(frozen=True)
class _LastPositions(Selection):
    """A selection the layer has never heard of: the k latest positions outside the window."""

    kind = "test"

    @property
    def window(self) -> int:
        return 4

    def select(self, layer, rows: slice, end: int) -> torch.Tensor:
        count = min(layer.capacity, end)
        positions = torch.arange(end - count, end, device=layer.keys.device)
        return positions.expand(*layer.keys[rows].shape[:2], count).contiguous()


def test_the_layer_delegates_choosing_to_its_selection():
    """A budgeted layer stores and attends; which positions it keeps is only its selection's `select`."""
    model = tiny_model("llama")
    cache = make_draft_cache(model, make_policy("rift-stat", budget=12, obs_window=4))
    layer = cache.budgeted_layers[0]
    layer.selector = _LastPositions(budget=12)
    layer._window, layer._capacity = layer.selector.window, layer.selector.selected
    with torch.no_grad():
        forward_tokens(model, list(range(1, 31)), cache, 0, logits=False)
        forward_tokens(model, [5], cache, 30)
    assert layer.selection[0, 0].tolist() == list(range(19, 27))  # k = 8 latest outside the window (27, 31]
    assert layer.working_set()[0] == [*range(19, 27), *range(28, 32)]
    assert isinstance(make_policy("full").selector, FullKV)
