"""Default batch sizes of the long stages: how many requests decode together (standard library only).

Measured on CPU with ``benchmarks/bench_throughput.py`` (docs/performance.md, "Throughput"): the
closed loop and target generation gain up to about 16 rows per forward, then the GEMMs are as
efficient as they get and each row only adds memory. The probe already runs every arm of a request
as rows of one forward (8 of them by default), so a few requests fill a forward, and each request
holds every arm's KV history (about 1 GB for a 2K-token prompt on SmolLM2-135M, fp32): its default
stays small. On a GPU the forwards stay memory-bound far longer; pass larger ``--batch-size`` /
``--probe-batch-size`` there (not measured here).
"""

from __future__ import annotations

CLOSED_BATCH = 16  # closed-loop (request x policy) runs, confirmation included
TARGETS_BATCH = 16  # target responses generated together
PROBE_BATCH = 4  # probed requests whose arms (and canonical passes) share each forward
