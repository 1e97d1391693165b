"""What glibc's mmap threshold costs the mid-sized temporaries of a batched bf16 round.

Every block above the threshold is a fresh mmap whose pages fault in on first touch and go back on free,
so an op whose output is above it pays that on each call. Three such ops of a batch-32 SmolLM2 round,
each timed in a fresh process per malloc setting (mallopt acts per process, and a heap's history
decides where blocks land): the (32, 3, 128, 64) bf16 -> float32 key upcast of the float32-softmax
attention path (3 MiB out), a softmax over 32 x 49,152 float32 logits (6 MiB) and a SiLU over a
verification's (32, 12, 1536) bf16 MLP activations (1.1 MiB).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/malloc_threshold.py
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
SETTINGS = (  # (mmap threshold, trim threshold) in bytes; 0 leaves glibc's dynamic default
    (0, 0),
    (1 << 20, 0),
    (4 << 20, 8 << 20),
    (16 << 20, 0),
    (16 << 20, 32 << 20),
    (32 << 20, 64 << 20),
)


def child(mmap_threshold: int, trim_threshold: int) -> dict[str, float]:
    libc = ctypes.CDLL("libc.so.6")
    if mmap_threshold:
        libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)
    if trim_threshold:
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
    import torch

    torch.set_num_threads(1)
    keys = torch.randn(32, 3, 128, 64).bfloat16()
    logits = torch.randn(32, 49152)
    activations = torch.randn(32, 12, 1536).bfloat16()

    def mean_ms(fn, calls: int = 200) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e3

    return {
        "key upcast": mean_ms(keys.float),
        "softmax": mean_ms(lambda: torch.softmax(logits, -1)),
        "silu": mean_ms(lambda: torch.nn.functional.silu(activations)),
    }


def label(size: int) -> str:
    return f"{size >> 20} MiB" if size else "glibc's dynamic default"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
        return
    print(f"{'mmap threshold':>24} {'trim threshold':>24} {'key upcast ms':>14} {'softmax ms':>11} {'silu ms':>8}")
    for mmap_threshold, trim_threshold in SETTINGS:
        command = [sys.executable, __file__, "--child", str(mmap_threshold), str(trim_threshold)]
        row = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        trim = label(trim_threshold) if trim_threshold else "glibc's (128 KiB once fixed)"
        if not mmap_threshold:
            trim = "glibc's dynamic default"
        times = f"{row['key upcast']:>14.3f} {row['softmax']:>11.3f} {row['silu']:>8.3f}"
        print(f"{label(mmap_threshold):>24} {trim:>24} {times}")


if __name__ == "__main__":
    main()
