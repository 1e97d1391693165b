"""Closed-loop AL against a dense-mask computation written apart from the cache code.

For position-determined policies (full KV, SWA, StreamingLLM) the draft's working set at each
query position is fixed, so the teacher-forced T = 0 loop can be predicted without rift-ada's
cache: one eager forward over prompt + response with explicit additive masks (full-attention
layers: causal over the prefill, the policy's band after it; the model's own sliding-window
layers: their window throughout) gives the draft's greedy token at every output position, and
the rounds follow from the leading matches (K per round, fewer at the end). The script runs the
real loop (`speculative_generate`, teacher-forced on the model's greedy response) beside it and
reports both ALs and their relative gap.

    OMP_NUM_THREADS=1 .venv/bin/python tools/dense_reference.py --model gemma3-270m --isl 800 \
        --tokens 128 --budget 256
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from rift_ada.budget import make_policy
from rift_ada.collectors.datasets import build_embedded_dataset, encode_prompt
from rift_ada.collectors.targets.generate import generate_response
from rift_ada.models import load_model, resolve_preset
from rift_ada.speculative import BatchRequest, speculative_generate_batch

SINKS = 4


def band(policy: str, budget: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """visible(query, key) of a decode query under ``policy`` (causality applied separately)."""
    if policy == "full":
        return lambda query, key: (key >= 0) & (query >= 0)
    if policy == "swa":
        return lambda query, key: key > query - budget
    if policy == "streamingllm":
        return lambda query, key: (key < SINKS) | (key > query - (budget - SINKS))
    raise ValueError(f"no dense band for policy {policy!r}")


@torch.no_grad()
def dense_greedy(model, ids: list[int], first_decode: int, visible) -> list[int]:
    """Greedy tokens predicted at positions first_decode.. under explicit per-layer-type masks."""
    length = len(ids)
    query = torch.arange(length)[:, None]
    key = torch.arange(length)[None, :]
    causal = key <= query
    full = causal & ((query < first_decode) | visible(query, key))
    masks = {"full_attention": full}
    window = getattr(model.config, "sliding_window", None)
    if window is not None and "sliding_attention" in (getattr(model.config, "layer_types", None) or []):
        masks["sliding_attention"] = causal & (key > query - window)
    additive = {
        name: torch.zeros(length, length).masked_fill(~mask, float("-inf"))[None, None] for name, mask in masks.items()
    }
    attention_mask = additive if len(additive) > 1 else additive["full_attention"]
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        logits = model(torch.tensor([ids]), attention_mask=attention_mask, logits_to_keep=length - first_decode).logits
    finally:
        model.set_attn_implementation(implementation)
    return logits[0].argmax(-1).tolist()


def rounds_from_matches(matches: list[bool], draft_length: int) -> int:
    """Rounds of the teacher-forced T = 0 loop: each drafts min(K, left) tokens and commits the
    leading matches plus one (the target's token)."""
    position, rounds = 0, 0
    while position < len(matches):
        steps = min(draft_length, len(matches) - position)
        accepted = 0
        while accepted < steps and matches[position + accepted]:
            accepted += 1
        position += min(accepted + 1, len(matches) - position)
        rounds += 1
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--isl", type=int, default=800, help="prompt length bucket (embedded dataset)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--draft-length", type=int, default=11)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--policies", default="full,swa,streamingllm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model(resolve_preset(args.model).draft)
    dataset = build_embedded_dataset(tokenizer, n_requests=args.requests, isl_buckets=[args.isl], seed=args.seed)
    rows, worst = [], 0.0
    for request in dataset:
        prompt = encode_prompt(tokenizer, request.prompt_messages)
        response = generate_response(model, prompt, max_new_tokens=args.tokens)
        names = args.policies.split(",")
        started = time.time()
        loops = speculative_generate_batch(  # the policies as rows of one batch (each = the request alone, tested)
            model,
            [BatchRequest(prompt, make_policy(name, budget=args.budget), forced_tokens=response) for name in names],
            draft_length=args.draft_length,
        )
        for name, loop in zip(names, loops, strict=True):
            predicted = dense_greedy(model, prompt + response, len(prompt) - 1, band(name, args.budget))
            matches = [int(a) == int(b) for a, b in zip(predicted, response, strict=False)]
            reference = len(response) / rounds_from_matches(matches, args.draft_length)
            gap = loop.acceptance_length / reference - 1
            worst = max(worst, abs(gap))
            row = {
                "request": request.request_id, "isl": len(prompt), "osl": len(response), "policy": name,
                "budget": args.budget, "draft_length": args.draft_length, "loop_al": round(loop.acceptance_length, 3),
                "dense_al": round(reference, 3), "gap": round(gap, 4), "seconds": round(time.time() - started, 1),
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    verdict = "PASS" if worst <= args.tolerance else "FAIL"
    print(f"{verdict}: largest |loop / dense - 1| = {worst:.4f} (tolerance {args.tolerance})")
    raise SystemExit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
