"""The probe's side of a budgeted layer, beside `rift_ada.cache`: arm working sets and diagnostics.

The probe (`rift_ada.collectors.probe`) runs every compressed arm as a row of a batched
`BudgetedLayer` (arms that share a history share a row: `keep_arm_rows`; `layer.arms` per stride:
`arm_working_sets`), and a canonical
full-attention pass whose probabilities measure each arm's retained mass (`arms_retained_mass`,
targets in `layer.mass_targets`). The draft/verify loop's diagnostics are here too: a working
set's current retained mass and the per-layer query summaries behind query drift. The layer keeps
the tensors; these functions read them, so the layer itself holds no probe logic but the arms'
storage path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rift_ada.attention import PendingAttention
    from rift_ada.cache import BudgetedLayer


@dataclass
class ArmWorkingSets:
    """One selection per probe arm, padded to k: ``selection`` (A, kv, k), ``valid`` (A, 1, k) real slots,
    ``prefix_limit`` (A,): positions below it are visible too (an unfilled selection), 0 otherwise."""

    selection: torch.Tensor
    valid: torch.Tensor
    prefix_limit: torch.Tensor


def arm_working_sets(layer: BudgetedLayer, selections: list[torch.Tensor], window_start: int) -> ArmWorkingSets:
    """Pad per-arm selections (each (1, kv, m)) to one tensor; unfilled (prefix) selections see positions < k."""
    capacity = layer.capacity
    device = layer.keys.device
    padded, valid, prefix_limit = [], [], []
    for selection in selections:
        if selection.shape[-1] < capacity:  # unfilled: everything below k that precedes the window
            count = min(capacity, window_start)
            selection = torch.arange(count, device=device).expand(selection.shape[1], count)[None]
            prefix_limit.append(capacity)
        else:
            prefix_limit.append(0)
        size = selection.shape[-1]
        pad = capacity - size
        padded.append(torch.nn.functional.pad(selection[0], (0, pad)))
        valid.append(torch.arange(capacity, device=device) < size)
    return ArmWorkingSets(
        torch.stack(padded), torch.stack(valid)[:, None, :], torch.tensor(prefix_limit, device=device)
    )


def reserve_arm_rows(layer: BudgetedLayer, rows: int) -> None:
    """Allocate ``layer``'s stored KV for ``rows`` arm histories at once; ``keys``/``values`` stay views of
    the rows in use, so arms parting later copy rows within it (`keep_arm_rows`) instead of allocating a
    larger tensor every stride, whose freed predecessors the heap keeps (+0.55 GiB a request of 2K tokens)."""
    in_use = layer.keys.shape[0]
    buffers = []
    for stored in (layer.keys, layer.values):
        buffer = stored.new_zeros((rows, *stored.shape[1:]))
        buffer[:in_use] = stored
        buffers.append(buffer)
    layer.arm_buffers = (buffers[0], buffers[1])
    layer.keys, layer.values = buffers[0][:in_use], buffers[1][:in_use]


def keep_arm_rows(layer: BudgetedLayer, parents: torch.Tensor) -> None:
    """Make row i of ``layer``'s stored state (KV, queries, kept attention-mass blocks) a copy of row
    ``parents[i]``: the probe's arms that share a history run as one row until their working sets part.
    Within the `reserve_arm_rows` buffers where the layer still reads them (rows kept in place are not
    copied); a new tensor otherwise."""
    in_use, wanted = layer.keys.shape[0], parents.shape[0]
    buffers = layer.arm_buffers
    if (
        buffers is not None
        and buffers[0].shape[0] >= wanted
        and buffers[0].shape[1:] == layer.keys.shape[1:]
        and buffers[0].data_ptr() == layer.keys.data_ptr()
        and buffers[1].data_ptr() == layer.values.data_ptr()
    ):
        kept = min(in_use, wanted)
        first_moved = kept if torch.equal(parents[:kept], torch.arange(kept, device=parents.device)) else 0
        for buffer in buffers:
            buffer[first_moved:wanted] = buffer.index_select(0, parents[first_moved:])
        layer.keys, layer.values = buffers[0][:wanted], buffers[1][:wanted]
    else:
        layer.keys = layer.keys.index_select(0, parents)
        layer.values = layer.values.index_select(0, parents)
    if layer.query_buffer is not None:
        layer.query_buffer = layer.query_buffer.index_select(0, parents)
    layer.keep_mass_rows(parents)


def arms_retained_mass(
    layer: BudgetedLayer, probs: torch.Tensor, pending: PendingAttention, targets: list[ArmWorkingSets]
) -> torch.Tensor:
    """Share of full-KV attention (b=1, kv, g, q, n) that each arm's working set in ``targets`` holds, (A,), averaged
    over heads and queries: the window's mass (every arm's) plus, for each key an arm sees, its mass from the
    queries whose window it is outside, summed over the query heads and queries once for all arms."""
    n_kv, group, n_queries, n_keys = probs.shape[1:]
    per_key = probs[0].float().sum(1)  # (kv, q, n): each KV head's group of query heads summed
    cells = n_kv * group * n_queries  # the (kv, g, q) cells each arm's mean is over
    query_positions = torch.arange(pending.first_position, pending.first_position + pending.n_new, device=probs.device)
    key_positions = torch.arange(n_keys, device=probs.device)
    in_window = (key_positions[None, :] > query_positions[:, None] - layer.window) & (
        key_positions[None, :] <= query_positions[:, None]
    )
    window_mass = (per_key * in_window).sum()
    outside_window = (per_key * ~in_window).sum(1)  # (kv, n)
    masses = []
    for target in targets:
        selection, valid, prefix_limit = target.selection, target.valid, target.prefix_limit
        n_arms = selection.shape[0]
        visible = torch.zeros(n_arms, n_kv, n_keys, dtype=torch.bool, device=probs.device)
        visible.scatter_(2, selection, valid.expand_as(selection))
        visible |= key_positions < prefix_limit[:, None, None]
        masses.append((window_mass + (outside_window * visible).sum((1, 2))) / cells)
    return torch.stack(masses).mean(0) if masses else torch.zeros(0)


def current_retained_mass(layer: BudgetedLayer, n_queries: int = 8) -> float:
    """Full-KV attention mass of ``layer``'s latest ``n_queries`` queries that falls in their working sets."""
    if layer.selector.full or layer.query_buffer is None or layer.selection is None:
        return 1.0
    queries = layer.query_buffer[:1, :, -n_queries:]
    positions = layer.query_positions[-n_queries:]
    n_kv = layer.keys.shape[1]
    group = queries.shape[1] // n_kv
    grouped = queries.reshape(1, n_kv, group, queries.shape[2], -1).float()
    keys = layer.stored_keys()[:1].float()
    logits = torch.einsum("bkgqd,bknd->bkgqn", grouped, keys) * layer.scaling
    key_positions = torch.arange(keys.shape[2], device=keys.device)
    causal = key_positions[None, :] <= positions[:, None]
    logits = logits.masked_fill(~causal, float("-inf"))
    if layer.sinks is not None:
        sink = layer.sinks.float().reshape(1, n_kv, group, 1, 1).expand(1, -1, -1, logits.shape[3], 1)
        probs = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(logits, -1)
    visible = (key_positions[None, :] > positions[:, None] - layer.window) & causal  # (q, n)
    visible = visible[None].expand(n_kv, -1, -1).clone()
    chosen = torch.zeros(n_kv, keys.shape[2], dtype=torch.bool, device=keys.device)
    chosen.scatter_(1, layer.selection[0], True)
    if layer.is_unfilled():
        chosen[:, : layer.capacity] = True
    visible |= chosen[:, None, :] & causal[None]
    return float((probs[0] * visible[:, None]).sum(-1).mean())


def layers_retained_mass(layers: list[BudgetedLayer], n_queries: int = 8) -> float:
    """Mean over ``layers`` of the full-KV attention mass their working sets hold."""
    masses = [current_retained_mass(layer, n_queries) for layer in layers]
    return float(sum(masses) / len(masses))


def layers_query_summary(layers: list[BudgetedLayer]) -> list[list[list[float]]] | None:
    """Per layer, per KV group: mean pre-RoPE query (batch row 0) since the last call; None if none."""
    summaries = [layer.pop_query_summary() for layer in layers]
    if any(summary is None for summary in summaries):
        return None
    return [summary[0].tolist() for summary in summaries]
