"""The demo's `report.md` and plots, rendered only from `demo.json` (so every number is traceable)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rift_ada.calibrate.export import atomic_write_text

STALENESS_PNG = "staleness_{tag}.png"


def _controller_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((row for row in rows if row["is_controller"]), None)


def table1_rows(summary: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, Any] | None]]]:
    """(method label, {temperature tag: closed-loop row or None}) in the paper's Table 1 order."""
    from rift_ada.calibrate.demo import TABLE_POLICIES

    rows = []
    for label, spec in TABLE_POLICIES:
        cells: dict[str, dict[str, Any] | None] = {}
        for tag, run in summary["runs"].items():
            closed = run["closed"]
            if spec == "ada":
                cells[tag] = _controller_row(closed)
            elif spec == "periodic":
                cells[tag] = next((r for r in closed if r["policy"] == run["reference"]), None)
            else:
                cells[tag] = next((r for r in closed if r["policy"] == spec), None)
        rows.append((label, cells))
    return rows


def _display(label: str, run: dict[str, Any]) -> str:
    """Policy label for people: the calibrated controller shows as RIFT-ada."""
    controller = _controller_row(run["closed"])
    return f"RIFT-ada ({label})" if controller is not None and controller["policy"] == label else label


def _fmt(value: Any, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _interval(interval: dict[str, Any] | None, percent: bool = False) -> str:
    if not interval or interval.get("estimate") is None:
        return "–"
    scale = 100.0 if percent else 1.0
    unit = "%" if percent else ""
    low, high = interval.get("low"), interval.get("high")
    bounds = "" if low is None or high is None else f" [{scale * low:+.1f}{unit}, {scale * high:+.1f}{unit}]"
    if not percent:
        bounds = "" if low is None or high is None else f" [{low:+.3f}, {high:+.3f}]"
        return f"{interval['estimate']:+.3f}{bounds}"
    return f"{scale * interval['estimate']:+.1f}{unit}{bounds}"


def plot_staleness(run: dict[str, Any], path: Path) -> None:
    """AL by output position (closed loop) per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = run["closed_by_position"]["curves"]
    bin_size = run["closed_by_position"]["bin_size"]
    figure, axis = plt.subplots(figsize=(7, 4))
    for label, values in curves.items():
        xs = [bin_size * (index + 0.5) for index, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        axis.plot(xs, ys, marker="o", label=_display(label, run))
    axis.set_xlabel("output position (tokens)")
    axis.set_ylabel("AL of rounds starting there")
    axis.set_title(f"Staleness curve, closed loop, T = {run['temperature']:g}")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _findings(summary: dict[str, Any]) -> list[str]:
    """Paper findings checked against this run, stated either way."""
    notes = []
    for tag, run in summary["runs"].items():
        by_policy = {row["policy"]: row for row in run["closed"]}
        ada = _controller_row(run["closed"])
        ref = by_policy.get(run["reference"])

        def al(name: str, by_policy: dict[str, Any] = by_policy) -> float | None:
            row = by_policy.get(name)
            return None if row is None else row["mean_al"]

        checks = [
            ("RIFT-stat beats SnapKV (paper §4.1: +37.8% at ρ = 0.5)", al("stat"), al("snapkv")),
            (
                "SWA beats SnapKV (paper: true on hybrid drafts, false on full-attention Llama3.1)",
                al("swa"),
                al("snapkv"),
            ),
            (f"RIFT-dyn ({run['reference']}) beats RIFT-stat (paper §4.2)", al(run["reference"]), al("stat")),
        ]
        for text, better, worse in checks:
            if better is None or worse is None:
                continue
            verdict = "holds" if better > worse else "does **not** hold"
            notes.append(f"- {tag}: {text} — {verdict} here ({better:.3f} vs {worse:.3f}).")
        if ada and ref and ref.get("refreshes_per_1k"):
            saving = 1 - (ada["refreshes_per_1k"] or 0) / ref["refreshes_per_1k"]
            notes.append(
                f"- {tag}: RIFT-ada vs {run['reference']} in the closed loop: AL {ada['mean_al']:.3f} vs "
                f"{ref['mean_al']:.3f}, {100 * saving:.0f}% fewer refreshes (paper: 2.03x fewer at matched AL). "
                + (
                    "Confirmed on the held-out split by the bootstrap."
                    if run["gain"]
                    else "The bootstrap on the held-out split does **not** confirm a gain "
                    "(verdict in the trade-off section above)."
                )
            )
    return notes


def _penalty(size: dict[str, Any]) -> str:
    penalty = size.get("repetition_penalty", 1.0)
    return "" if penalty == 1.0 else f", repetition penalty {penalty}"


def render_demo_markdown(summary: dict[str, Any]) -> str:
    size = summary["size"]
    lines = [
        "# rift-ada demo report",
        "",
        f"Model: **{summary['model']}** (`{summary['draft']}`), KV self-speculation: the budgeted model drafts "
        f"K = 11 tokens and the same model with full KV verifies. Dataset `{summary['dataset']}`: "
        f"{summary['n_requests']} requests, input lengths {min(summary['isl'])}–{max(summary['isl'])} tokens, "
        f"{size['output_tokens']} output tokens each; draft KV budget B = {size['budget']} "
        f"(≈{sum(summary['isl']) / len(summary['isl']) / size['budget']:.1f}x compression), sliding-window ratio 0.5, "
        f"SnapKV scoring (w = 64, pool 7), decision stride 8. Seed {summary['seed']}; wall time "
        f"{summary['wall_s'] / 60:.1f} min. Target responses were generated by the model itself (greedy at "
        f"T = 0, sampled at T = 1{_penalty(size)}) and every run is teacher-forced on them, so all policies see the "
        "same text. All numbers below come from `demo.json`.",
        "",
        "## Table 1: closed-loop AL on held-out requests",
        "",
        "Each method ran the real draft/verify loop on the calibration's confirmation split (requests the",
        "controller never saw). % is of the full-KV AL at the same temperature.",
        "",
    ]
    tags = list(summary["runs"])
    header = "| method | " + " | ".join(f"AL {t} | % full {t} | refreshes/1K {t}" for t in tags) + " |"
    lines += [header, "|---" * (1 + 3 * len(tags)) + "|"]
    for label, cells in table1_rows(summary):
        row = [label]
        for tag in tags:
            cell = cells.get(tag)
            if cell is None:
                row += ["–", "–", "–"]
            else:
                row += [_fmt(cell["mean_al"]), _pct(cell["pct_of_full"]), _fmt(cell["refreshes_per_1k"], 1)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## AL–refresh trade-off of the calibrated controller", ""]
    for tag, run in summary["runs"].items():
        rel = os.path.relpath(run["calibration_report"], start=summary.get("out_dir", "."))
        lines += [
            f"### {tag}",
            "",
            f"Splits (calibration / selection / confirmation): {run['split_sizes']}. Reference: periodic refresh "
            f"{run['reference']}. Full calibration report with the Pareto plot: [{rel}]({rel}).",
            "",
            "| comparison (confirmation split, paired bootstrap 95% CI) | baseline | refresh reduction "
            "| AL difference |",
            "|---|---|---|---|",
        ]
        for comparison in run["comparisons"]:
            lines.append(
                f"| {comparison['name']} | {comparison['baseline']} | "
                f"{_interval(comparison['refresh_reduction'], percent=True)} | "
                f"{_interval(comparison['al_difference'])} |"
            )
        lines += ["", run["verdict"]["text"], ""]
    lines += ["## AL by output position (staleness curve)", ""]
    for tag, run in summary["runs"].items():
        lines += [f"![staleness {tag}]({STALENESS_PNG.format(tag=tag)})", ""]
        curves = run["closed_by_position"]["curves"]
        bin_size = run["closed_by_position"]["bin_size"]
        n_bins = max((len(v) for v in curves.values()), default=0)
        lines += [
            "| policy | " + " | ".join(f"{bin_size * i}–{bin_size * (i + 1)}" for i in range(n_bins)) + " |",
            "|---" * (n_bins + 1) + "|",
        ]
        for label, values in curves.items():
            lines.append(f"| {_display(label, run)} | " + " | ".join(_fmt(v, 2) for v in values) + " |")
        lines.append("")
    lines += [
        "## Replay fidelity",
        "",
        "Replay rebuilds rounds from probe outcomes without a model; here it is compared with the closed loop of",
        "the same policy on the same requests (gap = replay − closed loop).",
        "",
        "| T | policy | requests | replay AL | closed AL | AL gap | replay ref/1K | closed ref/1K |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tag, run in summary["runs"].items():
        for fid in run["fidelity"]:
            lines.append(
                f"| {tag} | {_display(str(fid['policy']), run)} | {fid['n_matched']} | "
                f"{_fmt(fid.get('replay_mean_al'))} | {_fmt(fid.get('closed_mean_al'))} | {_fmt(fid.get('al_gap'))} | "
                f"{_fmt(fid.get('replay_refreshes_per_1k'), 1)} | {_fmt(fid.get('closed_refreshes_per_1k'), 1)} |"
            )
    lines += ["", "## How this compares with the paper", ""]
    lines += _findings(summary) or ["- (no comparable rows in this run)"]
    lines += [
        "",
        "Caveats: SmolLM2-135M is a full-attention model, where the paper itself finds prefill selection holds up",
        "better than on hybrid drafts; the demo's prompts are ~1K tokens with short outputs, far from the paper's",
        "32K/4K setting, and the confirmation split has only a few requests, so its intervals are wide. Run",
        "`rift-ada demo --size full` or real presets on a GPU for paper-scale numbers.",
        "",
    ]
    return "\n".join(lines)


def write_demo_report(summary: dict[str, Any], out_dir: str | Path) -> Path:
    folder = Path(out_dir)
    summary = dict(summary, out_dir=str(folder))
    for tag, run in summary["runs"].items():
        plot_staleness(run, folder / STALENESS_PNG.format(tag=tag))
    return atomic_write_text(folder / "report.md", render_demo_markdown(summary))
