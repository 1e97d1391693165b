"""How much of a model's greedy (T = 0) text loops on the embedded prompts, by ISL bucket.

Each request's target is decoded greedily with a full KV cache (EOS ends it, ``--tokens`` caps it), as
`rift-ada bench` makes its T = 0 targets; printed per request: seq-rep-4 (`collectors/loops.py`) over
the whole response and over its first half, and the loop's onset (`collectors/loops.py::loop_onset`: the
first token of 8 consecutive repeated 4-grams; the clean text a stop-at-loop rule would keep). The bench's
loop rule flags seq-rep-4 >= 0.3.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/greedy_loops.py --model gemma3-270m \
        --isl 1024 2048 --requests 8 --tokens 256
"""

from __future__ import annotations

import argparse
import time

import torch

from rift_ada.collectors.datasets import build_embedded_dataset, encode_prompt
from rift_ada.collectors.loops import loop_onset, repeated_ngram_share
from rift_ada.collectors.targets.generate import generate_response
from rift_ada.models import load_model, resolve_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--isl", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model(resolve_preset(args.model).draft)
    for isl in args.isl:
        for request in build_embedded_dataset(tokenizer, n_requests=args.requests, isl_buckets=[isl], seed=0):
            started = time.time()
            prompt = encode_prompt(tokenizer, request.prompt_messages)
            with torch.no_grad():
                response = generate_response(
                    model, prompt, max_new_tokens=args.tokens, temperature=0.0, eos_token_id=tokenizer.eos_token_id
                )
            print(
                f"isl {isl} {request.request_id} prompt {len(prompt)} output {len(response)} "
                f"seq-rep-4 {repeated_ngram_share(response, 4):.2f} "
                f"first half {repeated_ngram_share(response[: len(response) // 2], 4):.2f} "
                f"onset {loop_onset(response)} "
                f"{time.time() - started:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
