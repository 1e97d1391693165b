"""The paper's staleness findings on both embedded models, side by side (paper Fig. 1a/10, 2, 3).

For each model and temperature: target responses (T = 0 greedy, T = 1 sampled, seeded), then the
teacher-forced closed loop (`speculative_generate_batch`, every request x policy one batch row) for
full KV, SWA, SnapKV, RIFT-stat, RIFT-dyn at two refresh intervals and RIFT-stat at other window
shares rho, all at matched compression: B = ``--budget-share`` x the request's ISL, per request.
Reported: AL by output position, the retained share of full-KV attention mass of the working set
after each round (SWA, SnapKV, RIFT-stat), looping responses (seq-rep-4, collectors/loops.py), and
the two findings: does SWA overtake SnapKV late in the output, and how much refreshing lifts AL.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/staleness_models.py --requests 2 --tokens 128 \
        --out runs/staleness-models --results docs/results.md

``--results`` rewrites the section between ``<!-- staleness-models:begin -->`` and
``<!-- staleness-models:end -->`` (appended if absent) and writes its plots next to the page.
Each model's figures go to ``--out/<model>-T<temperatures>.json`` (models and temperatures may run
as separate processes); ``--from-json`` renders the section from those files without models.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BEGIN, END = "<!-- staleness-models:begin -->", "<!-- staleness-models:end -->"
QUARTERS = 4


def _policies(budget: int, deltas: list[int], rhos: list[float]) -> dict[str, Any]:
    from rift_ada.budget import make_policy

    policies = {
        "full": make_policy("full"),
        "swa": make_policy("swa", budget=budget),
        "snapkv": make_policy("snapkv", budget=budget),
        "rift-stat": make_policy("rift-stat", budget=budget),
    }
    for delta in deltas:
        policies[f"rift-dyn:{delta}"] = make_policy("rift-dyn", budget=budget, refresh_interval=delta)
    for rho in rhos:
        policies[f"rift-stat:rho={rho:g}"] = make_policy("rift-stat", budget=budget, sw_ratio=rho)
    return policies


class _MassHook:
    """Records the working set's retained full-KV attention mass after each round; refreshes as
    RIFT-dyn does when the policy has an interval (`PeriodicRefresh`)."""

    def __init__(self, interval: int | None, measure: bool):
        from rift_ada.speculative import PeriodicRefresh

        self.refresh = PeriodicRefresh(interval) if interval else None
        self.measure = measure
        self.masses: list[tuple[int, float]] = []

    def __call__(self, record, n_committed, cache) -> bool:
        if self.measure:
            self.masses.append((record.position, float(cache.retained_mass(8))))
        return self.refresh(record, n_committed, cache) if self.refresh is not None else False


def run_model(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rift_ada.collectors.datasets import build_embedded_dataset, encode_prompt
    from rift_ada.collectors.loops import repeated_ngram_share
    from rift_ada.collectors.targets import generate_response
    from rift_ada.models import load_model, resolve_preset
    from rift_ada.speculative import BatchRequest, speculative_generate_batch

    model, tokenizer = load_model(resolve_preset(model_name).draft)
    dataset = build_embedded_dataset(tokenizer, n_requests=args.requests, isl_buckets=[args.isl], seed=args.seed)
    prompts = [encode_prompt(tokenizer, request.prompt_messages) for request in dataset]
    out: dict[str, Any] = {"model": model_name, "requests": [r.request_id for r in dataset], "temperatures": {}}
    for temperature in args.temperatures:
        started = time.time()
        responses = [
            generate_response(model, prompt, max_new_tokens=args.tokens, temperature=temperature, seed=args.seed + i)
            for i, prompt in enumerate(prompts)
        ]
        loops = [repeated_ngram_share(response, 4) for response in responses]
        requests, labels, hooks = [], [], []
        for index, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            budget = max(96, int(round(args.budget_share * len(prompt))))
            for label, policy in _policies(budget, args.deltas, args.rhos).items():
                hook = _MassHook(policy.refresh_interval, measure=label in ("swa", "snapkv", "rift-stat"))
                requests.append(
                    BatchRequest(prompt, policy, seed=args.seed + index, refresh_hook=hook, forced_tokens=response)
                )
                labels.append((index, label, budget))
                hooks.append(hook)
        with torch.no_grad():
            results = speculative_generate_batch(
                model, requests, draft_length=args.draft_length, temperature=temperature, max_batch=args.batch
            )
        runs = []
        for (index, label, budget), result, hook in zip(labels, results, hooks, strict=True):
            runs.append(
                {
                    "request": index, "policy": label, "budget": budget, "isl": len(prompts[index]),
                    "al": result.acceptance_length, "refreshes": result.refreshes,
                    "rounds": [[r.position, r.al] for r in result.rounds], "mass": hook.masses,
                }
            )  # fmt: skip
        out["temperatures"][f"{temperature:g}"] = {
            "loop_share": loops,
            "looping": [share >= 0.5 for share in loops],
            "osl": [len(response) for response in responses],
            "runs": runs,
            "seconds": round(time.time() - started, 1),
        }
        print(f"{model_name} T={temperature:g}: {time.time() - started:.0f} s, loop shares {loops}", flush=True)
    del model
    return out


def _quarter_means(pairs: list[list[float]], length: int) -> list[float | None]:
    """Mean of the values whose position falls in each quarter of the output (None: none there)."""
    sums = np.zeros(QUARTERS)
    counts = np.zeros(QUARTERS)
    for position, value in pairs:
        quarter = min(QUARTERS - 1, int(QUARTERS * position / max(1, length)))
        sums[quarter] += value
        counts[quarter] += 1
    return [float(s / c) if c else None for s, c in zip(sums, counts, strict=True)]


def summarise(cell: dict[str, Any], keep_looping: bool) -> dict[str, dict[str, Any]]:
    """Per policy: macro AL, AL and retained mass by output quarter, over the requests kept."""
    looping = cell["looping"]
    table: dict[str, dict[str, Any]] = {}
    for run in cell["runs"]:
        if looping[run["request"]] and not keep_looping:
            continue
        length = cell["osl"][run["request"]]
        row = table.setdefault(run["policy"], {"al": [], "quarters": [], "mass": [], "refreshes": []})
        row["al"].append(run["al"])
        row["quarters"].append(_quarter_means(run["rounds"], length))
        row["refreshes"].append(run["refreshes"])
        if run["mass"]:
            row["mass"].append(_quarter_means(run["mass"], length))
    summary = {}
    for policy, row in table.items():

        def column_means(rows: list[list[float | None]]) -> list[float | None]:
            if not rows:
                return [None] * QUARTERS
            values = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)
            return [None if np.all(np.isnan(c)) else float(np.nanmean(c)) for c in values.T]

        summary[policy] = {
            "n": len(row["al"]),
            "al": float(np.mean(row["al"])),
            "quarters": column_means(row["quarters"]),
            "mass": column_means(row["mass"]),
            "refreshes": float(np.mean(row["refreshes"])),
        }
    return summary


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render(data: dict[str, Any], plot_dir: Path, page_dir: Path) -> str:
    """The results section (markdown) and its plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = data["settings"]
    lines = [
        BEGIN,
        "## Staleness on both embedded models (SmolLM2-135M full attention, Gemma3-270M hybrid)",
        "",
        *[
            f"- Command: `{run['command']}` at commit `{run['commit']}` ({run['seconds']:.0f} s)"
            for run in data["runs"]
        ],
        f"- {settings['requests']} embedded prompts per model (ISL bucket {settings['isl']}, each model's own "
        f"tokenizer), {settings['tokens']} output tokens, K = {settings['draft_length']}, teacher-forced closed "
        f"loop (the target's own response), B = {settings['budget_share']:g} × ISL per request (matched "
        "compression), seed " + str(settings["seed"]) + ". Gemma3's budget applies to its 3 full-attention layers; "
        "its 15 sliding layers keep their 512-token window.",
        "- Retained mass: the share of full-KV attention of the last 8 queries that the working set holds "
        "(mean over full-attention layers and heads), after each round. Looping: seq-rep-4 ≥ 0.5 "
        "(collectors/loops.py); looping requests are listed and left out of the tables below (all-request "
        "figures in the JSON).",
        "- Wall times are on the shared 2-core machine (other sessions' work running beside it).",
        f"- Size: {settings['requests']} request(s) × {settings['tokens']} output tokens per model and temperature, "
        "one text each: these rows are one sample, not evidence of a difference; a RIFT-dyn interval at or "
        "above the output length never refreshes (it equals RIFT-stat by construction).",
        "",
    ]
    temperatures = sorted({t for m in data["models"] for t in m["temperatures"]}, key=float)
    shape = (len(data["models"]), len(temperatures))
    figure, axes = plt.subplots(*shape, figsize=(5.5 * shape[1], 3.5 * shape[0]), squeeze=False)
    mass_figure, mass_axes = plt.subplots(*shape, figsize=(5.5 * shape[1], 3.5 * shape[0]), squeeze=False)
    for row_index, model in enumerate(data["models"]):
        for column, temperature in enumerate(temperatures):
            cell = model["temperatures"].get(temperature)
            if cell is None:
                lines += [f"### {model['model']}, T = {temperature}", "", "Not measured in this run.", ""]
                continue
            loops = ", ".join(f"{share:.2f}" for share in cell["loop_share"])
            kept = sum(not flag for flag in cell["looping"])
            lines += [
                f"### {model['model']}, T = {temperature}",
                "",
                f"Loop share per request (seq-rep-4): {loops}; {kept} of {len(cell['looping'])} requests kept.",
                "",
            ]
            summary = summarise(cell, keep_looping=False)
            if not summary:
                summary = summarise(cell, keep_looping=True)
                lines += [
                    "**Every request loops**: the table below is over looping text, where any recent window "
                    "predicts the output; it says little about staleness.",
                    "",
                ]
            lines += [
                "| policy | AL | AL Q1 | AL Q2 | AL Q3 | AL Q4 | mass Q1 | mass Q4 | refreshes |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for policy, row in summary.items():
                q, m = row["quarters"], row["mass"]
                lines.append(
                    f"| {policy} | {row['al']:.2f} | {' | '.join(_fmt(v) for v in q)} | {_fmt(m[0], 3)} | "
                    f"{_fmt(m[-1], 3)} | {row['refreshes']:.1f} |"
                )
            lines.append("")
            swa, snap, stat = summary.get("swa"), summary.get("snapkv"), summary.get("rift-stat")
            findings = []
            if swa and snap and None not in (swa["quarters"][-1], snap["quarters"][-1]):
                late = swa["quarters"][-1] - snap["quarters"][-1]
                early = (swa["quarters"][0] or 0.0) - (snap["quarters"][0] or 0.0)
                verdict = "yes" if late > 0 and early <= 0 else ("ahead throughout" if late > 0 else "no")
                findings.append(
                    f"SWA overtakes SnapKV late in the output: **{verdict}** (SWA − SnapKV AL: first quarter "
                    f"{early:+.2f}, last quarter {late:+.2f})."
                )
            if stat:
                lifts = [
                    f"{policy} {summary[policy]['al'] - stat['al']:+.2f}"
                    for policy in summary
                    if policy.startswith("rift-dyn:")
                ]
                findings.append(f"RIFT-dyn over RIFT-stat, AL: {', '.join(lifts)} (RIFT-stat {stat['al']:.2f}).")
                rhos = [p for p in summary if p.startswith("rift-stat:rho=")]
                if rhos:
                    sweep = ", ".join(
                        [f"ρ = 0.5: {stat['al']:.2f}"] + [f"{p.split('=')[1]}: {summary[p]['al']:.2f}" for p in rhos]
                    )
                    findings.append(f"ρ sweep of RIFT-stat (AL): {sweep}.")
            lines += [f"- {finding}" for finding in findings] + [""]
            axis = axes[row_index][column]
            mass_axis = mass_axes[row_index][column]
            for policy, row in summary.items():
                if policy.startswith("rift-stat:rho="):
                    continue
                axis.plot(range(1, QUARTERS + 1), [np.nan if v is None else v for v in row["quarters"]], "o-",
                          label=policy)  # fmt: skip
                if any(v is not None for v in row["mass"]):
                    mass_axis.plot(range(1, QUARTERS + 1), [np.nan if v is None else v for v in row["mass"]], "o-",
                                   label=policy)  # fmt: skip
            for ax, ylabel in ((axis, "AL"), (mass_axis, "retained mass")):
                ax.set_title(f"{model['model']}, T = {temperature}")
                ax.set_xlabel("output quarter")
                ax.set_ylabel(ylabel)
                ax.legend(fontsize=7)
    plot_dir.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    mass_figure.tight_layout()
    al_path, mass_path = plot_dir / "staleness_models_al.png", plot_dir / "staleness_models_mass.png"
    figure.savefig(al_path, dpi=90)
    mass_figure.savefig(mass_path, dpi=90)
    lines += [
        f"![AL by output quarter]({al_path.relative_to(page_dir)})",
        f"![retained mass by output quarter]({mass_path.relative_to(page_dir)})",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_section(page: Path, section: str) -> None:
    from rift_ada.atomic import atomic_write_text

    text = page.read_text() if page.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(page, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--isl", type=int, default=1024, help="embedded dataset ISL bucket")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--budget-share", type=float, default=0.25, help="B as a fraction of each request's ISL")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--deltas", default="16,64", help="RIFT-dyn refresh intervals")
    parser.add_argument("--rhos", default="0.25,0.75", help="RIFT-stat window shares beside 0.5")
    parser.add_argument("--draft-length", type=int, default=11)
    parser.add_argument("--batch", type=int, default=None, help="rows decoded together (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/staleness-models"))
    parser.add_argument("--results", type=Path, default=None, help="markdown page to (re)write the section in")
    parser.add_argument("--from-json", action="store_true", help="render --out/<model>-T*.json without models")
    args = parser.parse_args(argv)
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.deltas = [int(d) for d in args.deltas.split(",") if d]
    args.rhos = [float(r) for r in args.rhos.split(",") if r]
    models = args.models.split(",")
    if not args.from_json:  # one JSON per model (models can run as separate processes), then one section
        import subprocess

        import torch

        from rift_ada.calibrate.export import atomic_write_json

        torch.set_num_threads(1)
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout
        settings = {k: v for k, v in vars(args).items() if k not in ("out", "results", "from_json", "models")}
        for model in models:
            started = time.time()
            command = " ".join(["benchmarks/staleness_models.py", *(argv or sys.argv[1:])])
            data = {
                "settings": {**settings, "command": command, "commit": commit.strip()},
                "model": run_model(model, args),
            }
            data["settings"]["seconds"] = time.time() - started
            temperatures = "_".join(f"{t:g}" for t in args.temperatures)
            atomic_write_json(args.out / f"{model}-T{temperatures}.json", data)
    data = {"settings": None, "models": [], "runs": []}
    for model in models:  # every file of the model (temperatures may have run as separate processes)
        files = [json.loads(path.read_text()) for path in sorted(args.out.glob(f"{model}-T*.json"))]
        if not files:
            print(f"{args.out}: no {model}-T*.json: left out of the section", file=sys.stderr)
            continue
        merged = dict(files[0]["model"], temperatures={})
        for file in files:
            merged["temperatures"].update(file["model"]["temperatures"])
            data["runs"].append({key: file["settings"][key] for key in ("command", "commit", "seconds")})
        data["models"].append(merged)
        data["settings"] = data["settings"] or files[0]["settings"]
    if not data["models"]:
        raise SystemExit(f"{args.out}: no results for {', '.join(models)}")
    if args.results is not None:
        page = args.results
        write_section(page, render(data, page.parent / "results", page.parent))
    else:
        print(render(data, args.out, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
