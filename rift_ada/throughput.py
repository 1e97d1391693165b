"""Default batch sizes of the long stages: how many requests decode together (standard library only).

Measured on CPU with ``benchmarks/bench_throughput.py`` (docs/notes/2026-12-05-throughput-history.md): the
closed loop and target generation gain up to 16 rows per forward. The probe already runs every arm
of a request as rows of one forward; stacking requests gave no steady gain on CPU then (4 requests
below 1, 8 above it, within the machine's noise), while each request holds every arm's KV history
(about 0.85 GB for a 2K-token prompt and 256 output tokens on SmolLM2-135M, fp32), so it stayed at 1.
Since float32 Linears read packed weights (2026-12-06) stacking pays on the AMD Zen 4: float32 SmolLM2, 128-token
probes of ISL 328-448 prompts, 2 repeats on an idle machine, 20.8 against 16.4 tok/CPU-s at 8 requests against 1
(1.27x; 32-token probes 1.17x at 8, 1.25x at 16), about 1.0-1.2x with another model job beside it; and 8 requests of
2K-token prompts with 256-token probes peak at 10.5 GiB, under the closed loop's 11.9 GiB at its 32 rows (16 would hold
twice that): so `PROBE_BATCH` became 8 (docs/notes/2026-12-07-shared-prefills.md), the size `rift-ada bench` probed
at already.
Re-measured up to 64 rows on 2026-12-02 (the same note): the closed loop's
decode rate peaks at 32 rows (1.15x 16 rows) and the targets' at 64 (2.1x 16 rows), but memory grows
with the rows: with 2K-token prompts the closed loop already peaks at 6.2 GiB at 16 rows and the probe
at 11 GiB at 16 requests, so on a 24 GiB machine the defaults stay where memory is bounded for 2K
prompts. Gemma3-270M (2026-12-03): the closed loop is flat from 16 to 64 rows and target generation is
best at 16, peaking at 6.8 and 4.8 GiB at 16 rows with 2K-token prompts, so 16 is its optimum too.
On a GPU the forwards stay memory-bound far longer; pass larger ``--batch-size`` /
``--probe-batch-size`` there (not measured here).

In bfloat16 / float16 a row's KV histories take half float32's bytes, so `default_batch` doubles the
closed loop's and the targets' rows there (32): the same memory as float32's 16. On an Intel Xeon with AMX
(2026-12-05, docs/notes/2026-12-05-amx-packed-weights-sdpa.md) the bf16 closed loop read 47.2 tok/CPU-s at
32 rows against 58.6 at 64, targets 141.1 against 154.9; with 2K-token prompts the bf16 closed loop peaks at
9.24 GiB at 32 rows (float32's at 16: 8.96 GiB, on the Zen 4) and 17.53 GiB at 64, so 64 stays an option, not the
default, on a 24 GiB machine. Since float32 Linears read MKL-packed weights (`rift_ada.packed_linear`, two row counts
kept), float32's 16 rows peak at 9.89 GiB in the closed loop with 2K-token prompts
(docs/notes/2026-12-06-float32-mkl-packing.md).

Since 4022f1c a teacher-forced closed loop (every evidence run's) holds no target cache and runs no verification, so
its rows hold about half the KV they did, and draft steps are most of its work: on the AMD Zen 4 float32's closed
loop reads 1.23x at 32 rows over 16 (docs/notes/2026-12-07-forced-rows-no-verification.md), peaking at 11.9 GiB with
2K-token prompts (16 rows: 6.7 GiB now, 9.0-9.9 with the target cache before). So the closed loop (collection,
confirmation, and `rift-ada bench`'s targets and closed loop, which share one ``batch_size``) runs 32 rows in every
dtype (`CLOSED_BATCH`); bf16's 64, which its halved bytes would allow, is not measured since. `rift-ada targets`
keeps `TARGETS_BATCH` (16, doubled in bf16).

The probe, 2026-12-07 night (docs/notes/2026-12-07-probe-prefill-blocks.md): 16 requests of 328-448-token prompts
read 1.06x [1.02, 1.09] 8 side by side (float32, 32-token probes, 3 repeats on the Zen 4), and 32 read 0.90x 16 in
one run (of a tree whose prefills attended in blocks). Memory, not speed, kept it at 8: each request holds every
arm's KV of its prompt and response. So `PROBE_BATCH` is 16 and a request joins those in flight only while their
prompt and response positions stay within `PROBE_POSITION_BUDGET`, those of 8 requests of 2,048 + 256 tokens (the
10.5 GiB above): 16 requests of short prompts, 8 at docs/results.md's 2K-token prompts, as before.
"""

from __future__ import annotations

from rift_ada.models import default_dtype

CLOSED_BATCH = 32  # closed-loop (request x policy) runs, confirmation included, in every dtype (see above)
TARGETS_BATCH = 16  # target responses generated together
PROBE_BATCH = 16  # probed requests whose arms (and canonical passes) share each forward
PROBE_POSITION_BUDGET = 8 * (2048 + 256)  # prompt + response positions of the probed requests in flight (see above)
REDUCED_PRECISION_DTYPES = ("bfloat16", "float16")


def default_batch(float32_rows: int, dtype: str | None, device: str = "cpu") -> int:
    """Target generation's default rows for a model loaded in ``dtype`` (None: the loader's `default_dtype` for
    ``device``): ``float32_rows`` (`TARGETS_BATCH`) in float32, twice as many in bfloat16 / float16, whose rows hold
    half the KV bytes. The closed loop takes `CLOSED_BATCH` in every dtype."""
    resolved = dtype if dtype is not None else default_dtype(device)
    return float32_rows * 2 if resolved in REDUCED_PRECISION_DTYPES else float32_rows
