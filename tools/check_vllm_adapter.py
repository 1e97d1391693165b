"""Check rift-ada's vLLM proposer (rift_ada.vllm_adapter) inside a real vLLM (CPU or GPU build).

Two steps (``make vllm-check`` runs both):

``prepare`` (rift-ada's own venv): writes the models vLLM loads, each with transformers'
``save_pretrained`` (every tensor a loader reads, ``architectures`` set) — a tiny random Llama and
SmolLM2-135M from the embedded GGUF — and each one's prompts as token ids (seeded; SmolLM2's from
the embedded dataset).

``check`` (the vLLM venv), per model: (1) vLLM greedy, no speculation, equals transformers' greedy
output on the same prompt ids; (2) vLLM with `RiftDraftProposer` (budgeted draft, controller
refresh) gives the same output (T = 0), drafts are accepted, every refresh is the controller's
decision on the logged rounds replayed through a fresh `Session`, and each request's rounds
(accepted lengths, refreshes) equal rift-ada's own loop on the same request within one round;
(3) tokens/s with and without the proposer, all prompts in one batch and one at a time. Each vLLM
run is its own subprocess. Writes ``summary.json`` into ``--out``; exit 1 on a failed check::

    .venv/bin/python tools/check_vllm_adapter.py prepare --out runs/vllm-check
    .venv-vllm/bin/python tools/check_vllm_adapter.py check --model runs/vllm-check/tiny-llama \\
        --out runs/vllm-check/tiny-llama-check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHECK_POLICY = {  # reads what an engine can feed (no query_drift)
    "kind": "gate",
    "any": [
        {"signal": "acceptance", "op": "<=", "value": 6.0},
        {"signal": "entropy", "op": ">=", "value": 2.0},
    ],
}
TINY_CONFIG = {  # head_dim 64: vLLM's CPU attention takes 32, 64, 80, 96, 112, 128, 256 (not 16)
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    # weights 10x the default scale: peaked logits, so greedy choices are not near-ties that float
    # rounding flips between vLLM's kernels and transformers' (at 0.02 the logits are almost flat)
    "initializer_range": 0.2,
}


# -- prepare (rift-ada's venv) ------------------------------------------------------------------


def prepare(out: Path, *, n_prompts: int, seed: int, min_isl: int, max_isl: int, models: str = "tiny,smollm2") -> None:
    """Models (save_pretrained) and token-id prompts for the check, into ``out``."""
    import random

    import torch
    import transformers

    from rift_ada.collectors.datasets import encode_prompt
    from rift_ada.collectors.pipeline import load_requests
    from rift_ada.models import PRESETS, load_model

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tiny = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**TINY_CONFIG))
    tiny.save_pretrained(out / "tiny-llama")
    rng = random.Random(seed)
    vocab = TINY_CONFIG["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(300, 600))] for _ in range(n_prompts)]
    _write(out / "tiny-llama" / "prompts.json", {"seed": seed, "source": "uniform random ids", "prompts": prompts})
    if "smollm2" not in models.split(","):
        return

    model, tokenizer = load_model(PRESETS["smollm2-135m"].draft)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(out / "smollm2-135m")  # writes model.embed_tokens.weight (tied to lm_head)
    tokenizer.save_pretrained(out / "smollm2-135m")
    requests = [r for r in load_requests("embedded", tokenizer) if min_isl <= r.isl <= max_isl]
    chosen = sorted(rng.sample(range(len(requests)), min(n_prompts, len(requests))))
    prompts = [encode_prompt(tokenizer, requests[i].prompt_messages) for i in chosen]
    _write(
        out / "smollm2-135m" / "prompts.json",
        {
            "seed": seed,
            "source": f"embedded dataset, ISL {min_isl}-{max_isl}",
            "request_ids": [requests[i].request_id for i in chosen],
            "prompts": prompts,
        },
    )
    print(f"prepared {out}/tiny-llama and {out}/smollm2-135m ({len(prompts)} prompts each)")


def _write(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


# -- one vLLM run (a subprocess of check) ---------------------------------------------------------


def run_vllm(args: argparse.Namespace) -> None:
    """All prompts in one generate call, then each alone; writes tokens and timings to ``--result``."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(Path(args.prompts).read_text())["prompts"]
    extra: dict[str, Any] = {}
    if args.speculative:
        extra["speculative_config"] = {
            "method": "custom_class",
            "model": "rift_ada.vllm_adapter.RiftDraftProposer",
            "num_speculative_tokens": args.draft_length,
        }
    llm = LLM(
        model=args.model,
        dtype="float32",
        max_model_len=4096,
        enforce_eager=True,
        seed=0,
        skip_tokenizer_init=True,
        enable_prefix_caching=False,  # the one-at-a-time pass must not reuse the batched pass's prefills
        max_num_seqs=len(prompts),
        **extra,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, detokenize=False, ignore_eos=True)
    inputs = [TokensPrompt(prompt_token_ids=prompt) for prompt in prompts]
    log = Path(os.environ.get("RIFT_ADA_ROUNDS_LOG", os.devnull))
    started = time.perf_counter()
    batched = [list(o.outputs[0].token_ids) for o in llm.generate(inputs, params, use_tqdm=False)]
    batched_s = time.perf_counter() - started
    batched_lines = len(log.read_text().splitlines()) if log.is_file() else 0
    alone, alone_s = [], 0.0
    for prompt in inputs[: args.alone]:
        started = time.perf_counter()
        alone.append(list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids))
        alone_s += time.perf_counter() - started
    import torch
    import transformers
    import vllm

    result = {
        "batched": batched,
        "alone": alone,
        "batched_s": batched_s,
        "alone_s": alone_s,
        "batched_log_lines": batched_lines,
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
    }
    _write(Path(args.result), result)


# -- check (the vLLM venv) ------------------------------------------------------------------------


def _controller(args: argparse.Namespace, out: Path) -> Path:
    if args.controller is not None:
        return args.controller
    from rift_ada.controller import make_controller_dict

    path = out / "check-controller.json"
    data = make_controller_dict(
        CHECK_POLICY,
        name="vllm-check",
        draft=str(args.model),
        target=str(args.model),
        temperature=0.0,
        cache={"budget": args.budget, "block_size": None},
        schedule={"decision_stride": 8, "min_age": 16, "max_age": 256},
    )
    _write(path, data)
    return path


def _replay(controller_path: Path, rounds: list[dict]) -> tuple[int, int]:
    """(rounds whose refresh differs from the controller's replayed decision, refreshes)."""
    from rift_ada.controller import Controller

    controller = Controller.load(controller_path)
    by_request: dict[int, list[dict]] = {}
    for row in rounds:
        by_request.setdefault(row["request"], []).append(row)
    mismatches = refreshes = 0
    for rows in by_request.values():
        session = controller.new_session()
        for row in rows:
            session.record_round(row["accepted"] + 1, row["entropies"])
            decided = session.decide(row["position"] + row["accepted"] + 1)
            mismatches += decided != row["refreshed"]
            refreshes += row["refreshed"]
    return mismatches, refreshes


def _transformers_greedy(model: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' own greedy decoding, EOS not stopping it (as vLLM's ignore_eos; nothing masked)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def _first_difference(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for j, (s, t) in enumerate(zip(x, y, strict=False)):
            if s != t:
                return [i, j]
        if len(x) != len(y):
            return [i, min(len(x), len(y))]
    return None


def _per_request(rounds: list[dict]) -> dict[str, list[dict]]:
    by_prompt: dict[str, list[dict]] = {}
    for row in rounds:
        by_prompt.setdefault(row["prompt_sha1"], []).append(row)
    return by_prompt


def _figures(by_prompt: dict[str, list[dict]], n_tokens: int) -> dict[str, float]:
    """Macro AL (committed tokens after the prefill's / rounds) and refreshes per 1K committed tokens."""
    als = [sum(r["accepted"] + 1 for r in rows) / len(rows) for rows in by_prompt.values()]
    refreshes = sum(r["refreshed"] for rows in by_prompt.values() for r in rows)
    return {
        "mean_al": sum(als) / max(1, len(als)),
        "rounds": sum(len(rows) for rows in by_prompt.values()),
        "refreshes": refreshes,
        "refreshes_per_1k": 1000 * refreshes / max(1, n_tokens),
    }


def check(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from rift_ada.controller import Controller
    from rift_ada.vllm_adapter import draft_policy, loop_reference, prompt_key

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    prompts_file = args.prompts or args.model / "prompts.json"
    prompts = json.loads(prompts_file.read_text())["prompts"][: args.n_prompts]
    _write(out / "prompts.json", {"prompts": prompts})
    controller_path = _controller(args, out)
    log = out / "rounds.jsonl"
    reuse = {mode for mode in ("plain", "spec") if args.reuse and (out / f"{mode}.json").is_file()}
    if "spec" not in reuse:
        log.unlink(missing_ok=True)
    os.environ.pop("RIFT_ADA_BUDGET", None)  # the budget is the controller's unless --budget overrides it
    if args.budget is not None and args.controller is not None:
        os.environ["RIFT_ADA_BUDGET"] = str(args.budget)
    env = dict(os.environ, RIFT_ADA_CONTROLLER=str(controller_path), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    runs = {}
    for mode in ("plain", "spec"):
        if mode in reuse:  # --reuse: a vLLM run of an earlier check with the same --out
            runs[mode] = json.loads((out / f"{mode}.json").read_text())
            continue
        command = [
            sys.executable, __file__, "vllm-run", "--model", str(args.model), "--prompts", str(out / "prompts.json"),
            "--max-tokens", str(args.max_tokens), "--draft-length", str(args.draft_length),
            "--result", str(out / f"{mode}.json"), "--alone", str(args.alone),
        ]  # fmt: skip
        if mode == "spec":
            command.append("--speculative")
        run_env = dict(env, RIFT_ADA_ROUNDS_LOG=str(log)) if mode == "spec" else env
        with open(out / f"{mode}.log", "w") as handle:
            subprocess.run(command, env=run_env, check=True, stdout=handle, stderr=subprocess.STDOUT)
        runs[mode] = json.loads((out / f"{mode}.json").read_text())
    plain, spec = runs["plain"], runs["spec"]

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    reference = _transformers_greedy(model, prompts, args.max_tokens)
    rounds = [json.loads(line) for line in log.read_text().splitlines()]
    batched_rounds, alone_rounds = rounds[: spec["batched_log_lines"]], rounds[spec["batched_log_lines"] :]
    mismatches, refreshes = _replay(controller_path, rounds)

    controller = Controller.load(controller_path)
    policy = draft_policy(controller)  # the proposer's own (same settings)
    loop = loop_reference(
        model, prompts, [o[0] for o in spec["batched"]], args.max_tokens, policy=policy, controller=controller,
        draft_length=args.draft_length,
    )  # fmt: skip
    by_prompt = _per_request(batched_rounds)
    batched = _strip(by_prompt)
    comparisons = []
    for prompt, result in zip(prompts, loop, strict=True):
        logged = by_prompt.get(prompt_key(prompt), [])
        ours = [(r.accepted, r.refreshed) for r in result.rounds]
        theirs = [(r["accepted"], r["refreshed"]) for r in logged]
        comparisons.append(
            {
                "rounds": [len(theirs), len(ours)],
                "refreshes": [sum(x[1] for x in theirs), sum(x[1] for x in ours)],
                "al": [sum(x[0] + 1 for x in theirs) / max(1, len(theirs)), result.acceptance_length],
                "identical_rounds": theirs == ours,
                # vLLM's last step commits past max_tokens before its output is cut (the proposer sees it)
                "identical_but_last": theirs[:-1] == ours[:-1],
            }
        )
    n_tokens = sum(len(o) for o in spec["batched"]) - len(prompts)  # the prefill's tokens are not drafted
    loop_by_prompt = {
        prompt_key(p): [{"accepted": r.accepted, "refreshed": r.refreshed} for r in res.rounds]
        for p, res in zip(prompts, loop, strict=True)
    }
    total_out = sum(len(o) for o in plain["batched"])
    alone_out = sum(len(o) for o in plain["alone"])
    summary = {
        "model": str(args.model),
        "prompts": len(prompts),
        "isl": [len(p) for p in prompts],
        "max_tokens": args.max_tokens,
        "draft_length": args.draft_length,
        "controller": str(controller_path),
        "policy": {"name": policy.name, "budget": policy.budget, "block_size": policy.block_size},
        "versions": spec["versions"] | {"python": platform.python_version()},
        "vllm_equals_transformers": plain["batched"] == reference and plain["alone"] == reference[: args.alone],
        "vllm_vs_transformers_first_difference": _first_difference(plain["batched"], reference),
        "outputs_equal": spec["batched"] == plain["batched"] and spec["alone"] == plain["alone"],
        "alone_prompts": args.alone,
        "spec_first_difference": _first_difference(spec["batched"], plain["batched"]),
        "batched_rounds_equal_alone": all(
            batched.get(key) == rows for key, rows in _strip(_per_request(alone_rounds)).items()
        ),
        "vllm_proposer": _figures(by_prompt, n_tokens),
        "rift_ada_loop": _figures(loop_by_prompt, n_tokens),
        "per_request": comparisons,
        "replay_mismatches": mismatches,
        "refreshes_all_passes": refreshes,
        "tokens_per_s": {
            "plain_batch": total_out / plain["batched_s"],
            "plain_alone": alone_out / plain["alone_s"],
            "spec_batch": total_out / spec["batched_s"],
            "spec_alone": alone_out / spec["alone_s"],
        },
        "seconds": {k: round(v[f"{p}_s"], 2) for k, v in runs.items() for p in ("batched", "alone")},
        "command": " ".join(sys.argv),
    }
    accepted = sum(r["accepted"] for r in rounds)
    within_one_round = all(
        c["identical_but_last"]
        and abs(c["rounds"][0] - c["rounds"][1]) <= 1
        and abs(c["refreshes"][0] - c["refreshes"][1]) <= 1
        for c in comparisons
    )
    summary["loop_within_one_round"] = within_one_round
    checks = {
        "vllm equals transformers (greedy)": summary["vllm_equals_transformers"],
        "outputs equal with the proposer": summary["outputs_equal"],
        "drafts accepted": accepted > 0,
        "refreshes replay through a Session": mismatches == 0,
        "rounds equal rift-ada's loop within one round": within_one_round,
        "batched rounds equal one-at-a-time rounds": bool(summary["batched_rounds_equal_alone"]),
    }
    if not args.allow_no_refresh:
        checks["the working set was refreshed"] = refreshes > 0
    summary["checks"] = checks
    _write(out / "summary.json", summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "per_request"}, indent=2))
    failed = [name for name, ok in checks.items() if not ok]
    print("PASS" if not failed else f"FAIL: {', '.join(failed)}")
    return 0 if not failed else 1


def _strip(by_prompt: dict[str, list[dict]]) -> dict[str, list[tuple[int, bool]]]:
    return {key: [(r["accepted"], r["refreshed"]) for r in rows] for key, rows in by_prompt.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="models and prompts (rift-ada's venv)")
    p.add_argument("--out", type=Path, default=Path("runs/vllm-check"))
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-isl", type=int, default=400)
    p.add_argument("--max-isl", type=int, default=1200)
    p.add_argument("--models", default="tiny,smollm2", help="tiny, or tiny,smollm2")
    c = sub.add_parser("check", help="the check (the vLLM venv)")
    c.add_argument("--model", type=Path, required=True)
    c.add_argument("--prompts", type=Path, help="default: prompts.json in --model")
    c.add_argument("--n-prompts", type=int, default=8)
    c.add_argument("--controller", type=Path, help="default: a gate on acceptance and entropy")
    c.add_argument("--budget", type=int, help="draft budget (default: the controller's; 256 for the default one)")
    c.add_argument("--draft-length", type=int, default=11)
    c.add_argument("--max-tokens", type=int, default=96)
    c.add_argument("--alone", type=int, default=2, help="prompts also run one at a time (batch-1 tokens/s)")
    c.add_argument("--allow-no-refresh", action="store_true", help="do not require a refresh (short outputs)")
    c.add_argument("--out", type=Path, default=Path("runs/vllm-check/out"))
    c.add_argument("--reuse", action="store_true", help="reuse the vLLM runs already in --out (re-check only)")
    r = sub.add_parser("vllm-run", help=argparse.SUPPRESS)
    r.add_argument("--model", required=True)
    r.add_argument("--prompts", required=True)
    r.add_argument("--max-tokens", type=int, required=True)
    r.add_argument("--draft-length", type=int, required=True)
    r.add_argument("--result", required=True)
    r.add_argument("--speculative", action="store_true")
    r.add_argument("--alone", type=int, required=True)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(
            args.out, n_prompts=args.n_prompts, seed=args.seed, min_isl=args.min_isl, max_isl=args.max_isl,
            models=args.models,
        )  # fmt: skip
        return 0
    if args.command == "vllm-run":
        run_vllm(args)
        return 0
    if args.budget is None and args.controller is None:
        args.budget = 256
    return check(args)


if __name__ == "__main__":
    raise SystemExit(main())
