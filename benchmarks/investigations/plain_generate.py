"""The issue's "plain batch-1 decoding": transformers' own greedy ``generate`` at batch 1 on SmolLM2-135M, the
first 4 ragged prompts of `bench_throughput.py` (ISL 448, 440, 432, 424), 128 new tokens each (EOS suppressed),
tok/CPU-s end to end (prefills included, as the bench's end-to-end rates), in float32 and in bfloat16 (loaded by
`load_model`, so with packed Linear weights where oneDNN has bf16), one thread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/plain_generate.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
import bench_throughput as bench  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    for dtype in ("float32", "bfloat16"):
        setup = argparse.Namespace(quick=False, preset="smollm2-135m", dtype=dtype, isl=448, seed=0)
        model, tokenizer = bench.load(setup)
        tokens, seconds = 0, 0.0
        for prompt in bench.make_prompts(setup, tokenizer, 4):
            ids = torch.tensor([prompt])
            start = time.process_time()
            out = model.generate(
                ids, max_new_tokens=128, min_new_tokens=128, do_sample=False, pad_token_id=tokenizer.eos_token_id
            )
            seconds += time.process_time() - start
            tokens += out.shape[1] - ids.shape[1]
        print(f"{dtype}: generate at batch 1, {tokens / seconds:.1f} tok/CPU-s ({tokens} tokens, {seconds:.1f} CPU-s)")


if __name__ == "__main__":
    main()
