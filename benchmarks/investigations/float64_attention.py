"""Patch a package tree so that attention runs in float64, rounded once to the model's dtype (an experiment).

Takes a tree made by ``bench_throughput.py --make-tree`` and rewrites its ``rift_ada/attention.py`` so that
`_sdpa`, `_single_query_attention`, `_attention_probs` and `_attention_output` compute one dense formula,
softmax(q kᵀ · scale, masked) v, in float64 (bf16 products are exact in float64, so the logits do not depend on
the order of the sum), and round the output once. ``--scope budgeted`` keeps the tree's own kernels where a
call reads more than 256 keys (full caches: target generation, verifications, the probe's canonical pass).
Then run ``benchmarks/fidelity.py`` or ``bench_throughput.py --against`` with ``PYTHONPATH`` the patched tree
(docs/notes/2026-12-07-one-row-kernel.md, sections 8 and 9):

    .venv/bin/python benchmarks/bench_throughput.py --make-tree 7ac97d8 /tmp/new
    .venv/bin/python benchmarks/investigations/float64_attention.py /tmp/new /tmp/exp64 --scope all
    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/exp64 .venv/bin/python benchmarks/fidelity.py --out /tmp/fid-bf16-64 \
        --requests 4 --tokens 128 --budget 128 --temp 0 --periodic 16 --arm-ages 0,16,32,64 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

PATCH = """

# ---- float64_attention.py: attention in {precision}, rounded once to the dtype (scope: {scope}) ----
WIDE = torch.{precision}
SMALL_KEYS = {small_keys}


def _wide_attend(query, key, value, scaling, visible):
    b, h, q, d = query.shape
    kv = key.shape[1]
    grouped = query.to(WIDE).reshape(b, kv, h // kv, q, d)
    logits = torch.einsum("bkgqd,bknd->bkgqn", grouped, key.to(WIDE)) * scaling
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    out = torch.einsum("bkgqn,bknd->bkgqd", torch.softmax(logits, -1), value.to(WIDE))
    return out.reshape(b, h, q, -1).transpose(1, 2).contiguous().to(query.dtype)


def _wide_sdpa(query, key, value, mask, scaling, is_causal=False):
    b, h, q, d = query.shape
    kv, n = key.shape[1], key.shape[2]
    visible = None
    if is_causal:
        visible = (torch.arange(n)[None, :] <= torch.arange(n - q, n)[:, None])[None, None, None]
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask == 0
        per_head = allowed.shape[1] == h > 1
        allowed = allowed.reshape(allowed.shape[0], kv, h // kv, q, n) if per_head else allowed[:, :, None]
        visible = allowed if visible is None else visible & allowed
    return _wide_attend(query, key, value, scaling, visible)


def _wide_probs(query, key, scaling, visible, sinks):
    b, h, q, d = query.shape
    kv = key.shape[1]
    logits = torch.einsum("bkgqd,bknd->bkgqn", query.to(WIDE).reshape(b, kv, h // kv, q, d), key.to(WIDE)) * scaling
    if visible is not None:
        logits = logits.masked_fill(~visible, float("-inf"))
    if sinks is None:
        return torch.softmax(logits, dim=-1)
    sink = sinks.to(WIDE).reshape(1, kv, -1, 1, 1).expand(b, -1, -1, q, 1)
    return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]


def _wide_output(probs, value):
    b, kv, g, q, _ = probs.shape
    out = torch.einsum("bkgqn,bknd->bkgqd", probs.to(WIDE), value.to(WIDE)).to(value.dtype)
    return out.reshape(b, kv * g, q, -1).transpose(1, 2).contiguous()


_own_sdpa, _own_single, _own_probs, _own_output = _sdpa, _single_query_attention, _attention_probs, _attention_output


def _sdpa(query, key, value, mask, scaling, is_causal=False):
    own = key.shape[2] > SMALL_KEYS
    return (_own_sdpa if own else _wide_sdpa)(query, key, value, mask, scaling, is_causal)


def _single_query_attention(query, key, value, scaling, visible):
    own = key.shape[2] > SMALL_KEYS
    return (_own_single if own else _wide_attend)(query, key, value, scaling, visible)


def _attention_probs(query, key, scaling, visible, sinks):
    return (_own_probs if key.shape[2] > SMALL_KEYS else _wide_probs)(query, key, scaling, visible, sinks)


def _attention_output(probs, value):
    return (_own_output if value.shape[2] > SMALL_KEYS else _wide_output)(probs, value)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="a tree from bench_throughput.py --make-tree")
    parser.add_argument("out", type=Path, help="the patched copy (replaced if it exists)")
    parser.add_argument("--scope", choices=("all", "budgeted"), default="all")
    parser.add_argument("--precision", choices=("float64", "float32"), default="float64")
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(args.tree, args.out)
    attention = args.out / "rift_ada" / "attention.py"
    small_keys = "float('inf')" if args.scope == "all" else "256"
    patch = PATCH.format(precision=args.precision, scope=args.scope, small_keys=small_keys)
    attention.write_text(attention.read_text() + patch)
    print(f"{attention}: attention in {args.precision}, scope {args.scope}")


if __name__ == "__main__":
    main()
