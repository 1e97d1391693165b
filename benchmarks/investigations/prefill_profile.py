"""Where one prompt's prefill goes, and where a probe stride goes (SmolLM2-135M, float32, one thread).

``prefill``: one plain full-KV prefill of the bench's first ragged prompt (ISL 448) but its last token, timed three
times, then its operators by self CPU time (torch.profiler): the Linears' rate against the GEMM's shows whether a
prefill has anything left to gain. ``probe``: `probe_requests` of ``--batch`` requests (random ``--tokens``-token
responses), its requests' set-up (prefill, arms' copies) apart from its strides, then the strides' Python by
cumulative time (cProfile). ``split``: the same probe's CPU seconds by part (set-up, the stacked arms' and canonical
forwards, `prepare` with its rescoring, `finish`) and stride, and the arm rows each stride ran. ``faults``: the same
probe's set-up and strides apart, each as user and system CPU seconds, minor page faults and RSS growth (a page
touched for the first time is a fault the kernel serves in system time; `first_touch.py` measures its price).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/prefill_profile.py prefill
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/prefill_profile.py probe --batch 8 --tokens 32
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/prefill_profile.py split --batch 16 --tokens 32
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/prefill_profile.py faults --batch 16 --tokens 32
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_throughput  # noqa: E402


def profile_prefill(model, prompt: list[int]) -> None:
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    ids = torch.tensor([prompt[:-1]])

    def run() -> None:
        with torch.no_grad():
            model(input_ids=ids, past_key_values=DynamicCache(config=model.config), logits_to_keep=1)

    run()
    seconds = []
    for _ in range(3):
        start = time.process_time()
        run()
        seconds.append(time.process_time() - start)
    body = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "lm_head" not in n]
    params = sum(p.numel() for p in body)
    print(f"prefill of {ids.shape[1]} tokens: {', '.join(f'{s:.3f}' for s in seconds)} CPU-s; "
          f"Linears (no lm_head) {2 * params * ids.shape[1] / 1e9:.1f} GFLOP")  # fmt: skip
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def profile_probe(model, prompts: list[list[int]], batch: int, tokens: int) -> None:
    import rift_ada.collectors.probe as probe
    from rift_ada.budget import make_policy

    generator = torch.Generator().manual_seed(0)
    texts = [(p, torch.randint(0, 49000, (tokens,), generator=generator).tolist()) for p in prompts[:batch]]
    policy = make_policy("rift-stat", budget=128, obs_window=64)
    set_up = [0.0]
    original = probe._RequestProbe.__init__

    def timed(self, *args, **kwargs) -> None:
        start = time.process_time()
        original(self, *args, **kwargs)
        set_up[0] += time.process_time() - start

    probe._RequestProbe.__init__ = timed
    dict(probe.probe_requests(model, texts[:2], policy=policy, batch_size=2))  # warm up
    set_up[0] = 0.0
    start = time.process_time()
    dict(probe.probe_requests(model, texts, policy=policy, batch_size=batch))
    total = time.process_time() - start
    print(f"probe of {batch} x {tokens}: {total:.2f} CPU-s, set-up {set_up[0]:.2f}, strides {total - set_up[0]:.2f}")
    profiler = cProfile.Profile()
    profiler.enable()
    dict(probe.probe_requests(model, texts, policy=policy, batch_size=batch))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


def split_probe(model, prompts: list[list[int]], batch: int, tokens: int) -> None:
    import rift_ada.collectors.probe as probe
    from rift_ada.budget import make_policy

    generator = torch.Generator().manual_seed(0)
    texts = [(p, torch.randint(0, 49000, (tokens,), generator=generator).tolist()) for p in prompts[:batch]]
    policy = make_policy("rift-stat", budget=128, obs_window=64)
    seconds: dict[tuple[str, int], float] = collections.defaultdict(float)
    rows: dict[int, int] = collections.defaultdict(int)

    def timed_method(name: str):
        original = getattr(probe._RequestProbe, name)

        def run(self, *args, **kwargs):
            stride = getattr(self, "stride", 0)
            start = time.process_time()
            out = original(self, *args, **kwargs)
            seconds[(name, stride)] += time.process_time() - start
            if name == "prepare":
                rows[stride] += getattr(self, "rows", len(getattr(self, "arm_ages", ())) + 1)
            return out

        setattr(probe._RequestProbe, name, run)

    def timed_forward(name: str):
        original = getattr(probe, name)

        def run(draft_model, group):
            start = time.process_time()
            out = original(draft_model, group)
            seconds[(name.strip("_"), group[0].stride)] += time.process_time() - start
            return out

        setattr(probe, name, run)

    for name in ("__init__", "prepare", "finish"):
        timed_method(name)
    for name in ("_arms_forward", "_canonical_forward"):
        timed_forward(name)
    dict(probe.probe_requests(model, texts[:2], policy=policy, batch_size=2))  # warm up
    seconds.clear()
    rows.clear()
    start = time.process_time()
    dict(probe.probe_requests(model, texts, policy=policy, batch_size=batch))
    total = time.process_time() - start
    parts = ("__init__", "arms_forward", "canonical_forward", "prepare", "finish")
    strides = sorted({stride for _, stride in seconds})
    print(f"probe of {batch} x {tokens}: {total:.2f} CPU-s")
    print("stride  arm rows  " + "  ".join(f"{part:>17s}" for part in parts))
    for stride in strides:
        cells = "  ".join(f"{seconds.get((part, stride), 0.0):17.3f}" for part in parts)
        print(f"{stride:6d}  {rows.get(stride, 0):8d}  {cells}")
    sums = "  ".join(f"{sum(v for (k, _), v in seconds.items() if k == part):17.3f}" for part in parts)
    print(f"{'all':>6s}  {sum(rows.values()):8d}  {sums}")


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0])


def fault_probe(model, prompts: list[list[int]], batch: int, tokens: int) -> None:
    import rift_ada.collectors.probe as probe
    from rift_ada.budget import make_policy
    from rift_ada.memory import cap_heap_growth

    cap_heap_growth()  # as the CLI and bench_throughput.py run
    generator = torch.Generator().manual_seed(0)
    texts = [(p, torch.randint(0, 49000, (tokens,), generator=generator).tolist()) for p in prompts[:batch]]
    policy = make_policy("rift-stat", budget=128, obs_window=64)
    dict(probe.probe_requests(model, texts[:2], policy=policy, batch_size=2))  # warm up
    requests: list = []

    def set_up() -> None:
        for prompt, response in texts:
            requests.append(
                probe._RequestProbe(
                    model, list(prompt), list(response), policy=policy, temperature=0.0,
                    arm_ages=probe.DEFAULT_ARM_AGES, decision_stride=8, target_model=None,
                )
            )  # fmt: skip

    def strides() -> None:
        while not all(request.done for request in requests):
            for request in requests:
                request.prepare()
            arms = probe._arms_forward(model, requests)
            full = probe._canonical_forward(model, requests)
            for request, arm_logits, full_logits in zip(requests, arms, full, strict=True):
                request.finish(arm_logits, full_logits)

    print(f"probe of {batch} x {tokens}, as `probe_requests` runs {batch} at once")
    print("part        user s   system s   minor faults   RSS growth MiB")
    with torch.no_grad():
        for name, part in (("set-up", set_up), ("strides", strides)):
            before, rss = resource.getrusage(resource.RUSAGE_SELF), _rss_kib()
            part()
            after = resource.getrusage(resource.RUSAGE_SELF)
            print(f"{name:8s}  {after.ru_utime - before.ru_utime:8.2f}   {after.ru_stime - before.ru_stime:8.2f}   "
                  f"{after.ru_minflt - before.ru_minflt:12d}   {(_rss_kib() - rss) / 1024:14.0f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("prefill", "probe", "split", "faults"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--isl", type=int, default=448, help="the longest ragged prompt (the bench's prompts)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    setup = argparse.Namespace(quick=False, preset="smollm2-135m", dtype="float32", isl=args.isl, seed=0)
    model, tokenizer = bench_throughput.load(setup)
    prompts = bench_throughput.make_prompts(setup, tokenizer, max(args.batch, 1))
    if args.what == "prefill":
        profile_prefill(model, prompts[0])
    elif args.what == "probe":
        profile_probe(model, prompts, args.batch, args.tokens)
    elif args.what == "faults":
        fault_probe(model, prompts, args.batch, args.tokens)
    else:
        split_probe(model, prompts, args.batch, args.tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
