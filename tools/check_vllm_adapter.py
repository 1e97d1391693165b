"""Check the vLLM prototype adapter (rift_ada.vllm_adapter) on a real vLLM install, CPU or GPU.

1. greedy decoding with vLLM, no speculation; 2. the same prompts with speculative decoding by
`RiftDraftProposer` (rift-ada budgeted draft + controller); then checks that the outputs are equal
(T = 0), that drafts were accepted and the working set was refreshed, and that every refresh is
the decision the controller makes when the logged rounds are replayed through a fresh `Session`.
Each vLLM run is its own subprocess. Writes a JSON summary. Exit 1 on a failed check.

    python tools/check_vllm_adapter.py --model DIR [--controller FILE] [--budget 256] [--out DIR]

``--model``: an HF directory vLLM can load (its config.json must name the architecture). The
default controller reads acceptance and entropy only (query summaries are not in the round log).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, then explain it line by line.",
    "List the planets of the solar system in order, with one sentence about each.",
    "def quicksort(items):",
]
CHECK_POLICY = {
    "kind": "gate",
    "any": [
        {"signal": "acceptance", "op": "<=", "value": 6.0},
        {"signal": "entropy", "op": ">=", "value": 2.0},
    ],
}


def _run_vllm(args: argparse.Namespace, speculative: bool, log: Path) -> list[list[int]]:
    """One vLLM run in this process (called in a subprocess); returns output token ids per prompt."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    extra = {}
    if speculative:
        os.environ["RIFT_ADA_ROUNDS_LOG"] = str(log)
        extra["speculative_config"] = {
            "method": "custom_class",
            "model": "rift_ada.vllm_adapter.RiftDraftProposer",
            "num_speculative_tokens": args.draft_length,
        }
    llm = LLM(model=args.model, dtype="float32", max_model_len=2048, enforce_eager=True, seed=0, **extra)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    return [list(output.outputs[0].token_ids) for output in outputs]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--controller", type=Path)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--draft-length", type=int, default=11)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("runs/vllm-check"))
    parser.add_argument("--run", choices=("plain", "spec"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "rounds.jsonl"
    if args.run:  # the subprocess
        tokens = _run_vllm(args, args.run == "spec", log)
        (args.out / f"{args.run}.json").write_text(json.dumps(tokens))
        return 0

    controller = args.controller
    if controller is None:
        from rift_ada.controller import make_controller_dict

        controller = args.out / "check-controller.json"
        data = make_controller_dict(
            CHECK_POLICY,
            name="vllm-check",
            draft=args.model,
            target=args.model,
            temperature=0.0,
            cache={"budget": args.budget, "block_size": None},
            schedule={"decision_stride": 8, "min_age": 16, "max_age": 256},
        )
        controller.write_text(json.dumps(data, indent=2))
    log.unlink(missing_ok=True)
    env = dict(
        os.environ,
        RIFT_ADA_CONTROLLER=str(controller),
        RIFT_ADA_BUDGET=str(args.budget),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    base = [
        sys.executable,
        __file__,
        "--model",
        args.model,
        "--out",
        str(args.out),
        "--budget",
        str(args.budget),
        "--draft-length",
        str(args.draft_length),
        "--max-tokens",
        str(args.max_tokens),
    ]
    for mode in ("plain", "spec"):
        subprocess.run([*base, "--run", mode], env=env, check=True)
    plain = json.loads((args.out / "plain.json").read_text())
    spec = json.loads((args.out / "spec.json").read_text())
    rounds = [json.loads(line) for line in log.read_text().splitlines()]
    mismatches, refreshes = _replay(controller, rounds)
    accepted = sum(row["accepted"] for row in rounds)
    summary = {
        "model": args.model,
        "budget": args.budget,
        "draft_length": args.draft_length,
        "outputs_equal": plain == spec,
        "first_difference": next(
            (
                [i, j]
                for i, (a, b) in enumerate(zip(plain, spec, strict=True))
                for j, (x, y) in enumerate(zip(a, b, strict=False))
                if x != y
            ),
            None,
        ),
        "rounds": len(rounds),
        "mean_al": (accepted + len(rounds)) / max(1, len(rounds)),
        "refreshes": refreshes,
        "replay_mismatches": mismatches,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    ok = summary["outputs_equal"] and refreshes > 0 and accepted > 0 and mismatches == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
