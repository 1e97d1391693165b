"""`rift_ada.probe_arms.arms_retained_mass` against a from-scratch count: for each arm, KV head, query head and
query, the canonical pass's attention on the keys the arm sees (its window, its selection's valid slots, an unfilled
selection's prefix), averaged over heads and queries and over the targets."""

from __future__ import annotations

import types

import torch

from rift_ada.attention import PendingAttention
from rift_ada.probe_arms import ArmWorkingSets, arms_retained_mass


def _reference(probs: torch.Tensor, first: int, window: int, targets: list[ArmWorkingSets]) -> torch.Tensor:
    _, n_kv, group, n_queries, n_keys = probs.shape
    per_target = []
    for target in targets:
        arm_masses = []
        for arm in range(target.selection.shape[0]):
            cells = []
            for head in range(n_kv):
                seen = {
                    int(position)
                    for position, valid in zip(target.selection[arm, head], target.valid[arm, 0], strict=True)
                    if valid
                }
                seen |= set(range(int(target.prefix_limit[arm])))
                for query_head in range(group):
                    for query in range(n_queries):
                        position = first + query
                        total = 0.0
                        for key in range(n_keys):
                            if position - window < key <= position or key in seen:
                                total += float(probs[0, head, query_head, query, key])
                        cells.append(total)
            arm_masses.append(sum(cells) / len(cells))
        per_target.append(arm_masses)
    return torch.tensor(per_target).mean(0)


def test_retained_mass_of_each_arm_matches_a_count_by_hand():
    generator = torch.Generator().manual_seed(3)
    n_kv, group, n_queries, first, window, capacity = 2, 3, 4, 30, 6, 5
    n_keys = first + n_queries
    logits = torch.randn(1, n_kv, group, n_queries, n_keys, generator=generator) * 2
    keys, queries = torch.arange(n_keys), torch.arange(first, first + n_queries)
    logits = logits.masked_fill(keys[None, :] > queries[:, None], float("-inf"))
    probs = torch.softmax(logits, -1)
    targets = []
    for seed in (0, 1):
        picks = torch.Generator().manual_seed(seed)
        heads = [[torch.randperm(first - window, generator=picks)[:capacity] for _ in range(n_kv)] for _ in range(3)]
        selection = torch.stack([torch.stack(arm) for arm in heads])  # positions before every query's window
        valid = torch.ones(3, 1, capacity, dtype=torch.bool)
        valid[1, 0, 3:] = False  # padded slots: not seen
        prefix_limit = torch.tensor([0, 0, capacity])  # arm 2: an unfilled selection also sees positions < capacity
        targets.append(ArmWorkingSets(selection, valid, prefix_limit))
    layer = types.SimpleNamespace(window=window)
    pending = PendingAttention(layer, first, n_queries, full=True)
    got = arms_retained_mass(layer, probs, pending, targets)
    expected = _reference(probs, first, window, targets)
    torch.testing.assert_close(got, expected.float(), atol=1e-6, rtol=0)
    assert len(set(got.tolist())) == 3  # the arms see different keys and hold different mass


def test_arm_rows_parting_into_reserved_rows_are_written_whole_before_they_are_read():
    # reserved rows past those in use hold NaN here: every row the layer reads once arms part must be its parent's
    # row, every position of it, copied within the reserved rows
    from rift_ada.budget import CachePolicy
    from rift_ada.cache import BudgetedLayer
    from rift_ada.probe_arms import keep_arm_rows, reserve_arm_rows

    layer = BudgetedLayer(CachePolicy(budget=16, obs_window=4), 0, 0.125)
    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(1, 2, 24, 8, generator=generator) for _ in range(2))
    layer.keys, layer.values = keys.clone(), values.clone()
    reserve_arm_rows(layer, 5)
    assert layer.keys.shape[0] == 1 and torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    for buffer in layer.arm_buffers:
        buffer[1:] = float("nan")
    keep_arm_rows(layer, torch.tensor([0, 0, 0]))  # two arms part from row 0
    assert torch.equal(layer.keys, keys.expand(3, -1, -1, -1)) and torch.equal(
        layer.values, values.expand(3, -1, -1, -1)
    )
    layer.keys[1] += 1.0  # row 1 goes its own way (the layer writes in place)
    keep_arm_rows(layer, torch.tensor([0, 1, 2, 1, 1]))
    assert not layer.keys.isnan().any() and not layer.values.isnan().any()
    assert torch.equal(layer.keys[3], keys[0] + 1.0) and torch.equal(layer.keys[4], keys[0] + 1.0)
    assert layer.keys.data_ptr() == layer.arm_buffers[0].data_ptr()  # still within the reserved rows
