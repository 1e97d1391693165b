"""``report.md`` and PNG plots, rendered only from the numbers in ``calibration.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rift_ada.atomic import atomic_write, atomic_write_text

PARETO_PNG = "pareto.png"
POSITION_PNG = "al_by_position.png"


_KEY_ORDER = (
    "calibration",
    "selection",
    "confirmation",
    "acceptance",
    "entropy",
    "query_drift",
    "acceptance_drop",
    "entropy_rise",
)


def _ordered(mapping: dict[str, Any]) -> list[tuple[str, Any]]:
    """Items in a fixed order (JSON round trips sort keys): known names first, then the rest sorted."""
    rank = {name: i for i, name in enumerate(_KEY_ORDER)}
    return sorted(mapping.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def _policies_in_order(conf: dict[str, Any]) -> list[tuple[str, Any]]:
    order = conf.get("policy_order") or sorted(conf["policies"])
    return [(label, conf["policies"][label]) for label in order]


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100.0 * value:.1f}%"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ci_text(ci: dict[str, Any] | None, percent: bool = False) -> str:
    if not ci:
        return "–"
    scale, unit = (100.0, "%") if percent else (1.0, "")
    est, low, high = ci["estimate"], ci["low"], ci["high"]
    digits = 1 if percent else 3
    if low is None or high is None:
        return f"{scale * est:+.{digits}f}{unit} (no interval)"
    return f"{scale * est:+.{digits}f}{unit} [{scale * low:+.{digits}f}{unit}, {scale * high:+.{digits}f}{unit}]"


def plot_pareto(calibration: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """AL vs refreshes per 1K: all trials, Pareto front, periodic curve, stat and the chosen point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = calibration["trials"]
    search = [t for t in trials if not t["baseline"]]
    pareto_numbers = set(calibration["operating_point"]["pareto_trials"])
    front = sorted((t for t in search if t["number"] in pareto_numbers), key=lambda t: t["refreshes_per_1k"])
    curve = calibration["periodic_curve"]
    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=110)
    for family, color in (("gate", "tab:blue"), ("score", "tab:green")):
        pts = [t for t in search if t["family"] == family]
        if pts:
            ax.scatter(
                [t["refreshes_per_1k"] for t in pts],
                [t["mean_al"] for t in pts],
                s=9,
                alpha=0.35,
                color=color,
                label=f"{family} trials",
            )
    if front:
        ax.step(
            [t["refreshes_per_1k"] for t in front],
            [t["mean_al"] for t in front],
            where="post",
            color="black",
            lw=1.2,
            label="Pareto front (adaptive)",
        )
    if curve:
        ax.plot(
            [c["refreshes_per_1k"] for c in curve],
            [c["mean_al"] for c in curve],
            "o--",
            color="tab:red",
            label="periodic (RIFT-dyn)",
        )
        for c in curve:
            ax.annotate(
                f"Δ={c['interval']}",
                (c["refreshes_per_1k"], c["mean_al"]),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
                color="tab:red",
            )
    stat = next((t for t in trials if t["label"] == "stat"), None)
    if stat is not None:
        ax.axhline(stat["mean_al"], color="gray", ls=":", lw=1, label="RIFT-stat")
    chosen = calibration["operating_point"]["chosen"]
    ax.scatter(
        [chosen["refreshes_per_1k"]],
        [chosen["mean_al"]],
        marker="*",
        s=180,
        color="gold",
        edgecolor="black",
        zorder=5,
        label="chosen",
    )
    if all(t["refreshes_per_1k"] > 0 for t in search) and all(c["refreshes_per_1k"] > 0 for c in curve):
        ax.set_xscale("log")
    ax.margins(x=0.08)
    ax.set_xlabel("refreshes per 1K committed tokens (selection split)")
    ax.set_ylabel("mean AL (selection split)")
    ax.set_title(f"AL–refresh trade-off: {calibration['name']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    atomic_write(path, lambda temporary: fig.savefig(temporary, format="png"))
    plt.close(fig)
    return Path(path)


def plot_al_by_position(calibration: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Mean AL per output-position bin on the confirmation split, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = calibration["confirmation"]
    edges = conf["position_edges"]
    centers = [(a + b) / 2.0 for a, b in zip(edges[:-1], edges[1:], strict=False)]
    fig, ax = plt.subplots(figsize=(7.0, 4.0), dpi=110)
    for label, entry in _policies_in_order(conf):
        series = entry["al_by_position"]
        n = min(len(series), len(centers))
        xs = [centers[i] for i in range(n) if series[i] is not None]
        ys = [series[i] for i in range(n) if series[i] is not None]
        ax.plot(xs, ys, marker=".", lw=1.3, label=f"{label} ({entry['role']})")
    ax.set_xlabel("output position (tokens)")
    ax.set_ylabel("mean AL (confirmation split)")
    ax.set_title("AL by output position")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.85)
    fig.tight_layout()
    atomic_write(path, lambda temporary: fig.savefig(temporary, format="png"))
    plt.close(fig)
    return Path(path)


def _margin_lines(conf: dict[str, Any]) -> list[str]:
    """The non-inferiority margin the verdict used (and where the verdict comes from)."""
    margin = conf["verdict"].get("margin") or conf.get("margin")
    if not margin:
        return []
    source = conf["verdict"].get("source", "replay")
    return [
        f'Verdict source: {source}. "AL kept" means non-inferiority: the lower 95% CI bound of the AL '
        f"difference vs the reference is >= -{margin['al']:.3f} AL (margin {100 * margin['fraction']:g}% of "
        f"the reference AL {margin['reference_al']:.3f}).",
        "",
    ]


def _closed_loop_lines(conf: dict[str, Any]) -> list[str]:
    """Closed-loop confirmation beside replay's (present after ``--confirm closed``)."""
    closed = conf.get("closed_loop")
    if not closed:
        return []
    mode = (
        "free-running rejection sampling (each policy its own text)"
        if closed["free_running"]
        else "teacher-forced on the target responses (exact at T = 0; at T > 0 the free-running law given the text)"
    )
    rows = []
    for label, entry in closed["policies"].items():
        c, r = entry["closed"], entry["replay"]
        rows.append(
            [label, entry["role"], c["mean_al"], r.get("mean_al"), c["refreshes_per_1k"], r.get("refreshes_per_1k")]
        )
    comparison_rows = [
        [
            comp["name"],
            comp["baseline"],
            _ci_text(comp["refresh_reduction"], percent=True),
            _ci_text(comp["al_difference"]),
        ]
        for comp in closed["comparisons"]
    ]
    return [
        "## Closed-loop confirmation",
        "",
        f"The verdict above comes from the real draft/verify loop ({mode}) on the {closed['n_requests']} "
        f"confirmation requests (run in `{closed['run_dir']}`); replay's figures stand beside it. Replay's own "
        f"verdict: {closed['replay_verdict']['text']}",
        "",
        _table(["policy", "role", "closed AL", "replay AL", "closed refreshes/1K", "replay refreshes/1K"], rows),
        "",
        _table(["comparison", "baseline", "refresh reduction (95% CI)", "AL difference (95% CI)"], comparison_rows),
        "",
    ]


def render_markdown(calibration: dict[str, Any]) -> str:
    """The report text (tables only need ``calibration``)."""
    c = calibration
    op = c["operating_point"]
    conf = c["confirmation"]
    ref = op["reference"]
    chosen = op["chosen"]
    out: list[str] = [
        f"# Calibration report: {c['name']}",
        "",
        f"Draft `{c['draft']}`, target `{c['target']}`, temperature {c['temperature']}. "
        f"Seed {c['seed']}, created {c['created']}. Traces: {c['traces']['n_requests']} requests, "
        f"manifest hash `{c['traces'].get('manifest_hash') or '–'}`.",
        "",
        "## Verdict",
        "",
        conf["verdict"]["text"],
        "",
        *_margin_lines(conf),
        *_closed_loop_lines(conf),
        "## Splits",
        "",
        "Seeded, disjoint, stratified by dataset category and ISL bucket; the request ids of each "
        "split are in `calibration.json` (`splits.request_ids`).",
        "",
        _table(
            ["split", "requests", "share"],
            [[k, v, _pct(v / max(1, sum(c["splits"]["sizes"].values())))] for k, v in _ordered(c["splits"]["sizes"])],
        ),
        "",
        "## Threshold grids (calibration split)",
        "",
        f"Percentiles {c['grids']['percentiles'][0]:g}..{c['grids']['percentiles'][-1]:g} of each signal "
        "over "
        f"{c['grids']['n_decisions']} decision points (all working-set ages).",
        "",
    ]
    grid_rows = []
    for signal, values in _ordered(c["grids"]["values"]):
        if values:
            grid_rows.append([signal, len(values), values[0], values[len(values) // 2], values[-1]])
    out += [_table(["signal", "thresholds", "lowest", "middle", "highest"], grid_rows), ""]
    if c["space"]["score_terms"]:
        out += ["Fitted score terms (calibration split):", ""]
        out += [
            _table(
                ["signal", "orientation", "mean", "scale", "weight"],
                [
                    [t["signal"], t.get("orientation"), t.get("mean"), t.get("scale"), t.get("weight")]
                    for t in c["space"]["score_terms"]
                ],
            ),
            "",
        ]
    study = c["study"]
    out += [
        "## Study (selection split)",
        "",
        f"{study['complete']} complete trials ({study['search_trials']} searched + {study['n_baselines']} "
        f"baselines) of study `{study['name']}` in `{study['storage']}`, sampler {study['sampler']}, "
        f"{study['workers']} worker(s), {study['wall_s']:.1f} s. Objectives: mean AL (max), refreshes per "
        "1K committed tokens (min), both by replay.",
        "",
        "Baselines:",
        "",
        _table(
            ["policy", "mean AL", "refreshes / 1K"],
            [[t["label"], t["mean_al"], t["refreshes_per_1k"]] for t in c["trials"] if t["baseline"]],
        ),
        "",
        "Pareto front of the adaptive trials:",
        "",
        _table(
            ["trial", "family", "mean AL", "refreshes / 1K"],
            [
                [t["number"], t["family"], t["mean_al"], t["refreshes_per_1k"]]
                for t in sorted(
                    (t for t in c["trials"] if t["number"] in set(op["pareto_trials"])),
                    key=lambda t: t["refreshes_per_1k"],
                )
            ],
        ),
        "",
        f"![AL–refresh trade-off]({PARETO_PNG})",
        "",
        "## Operating point (selection split)",
        "",
    ]
    rows = [["reference " + ref["label"], ref["number"], ref["mean_al"], ref["refreshes_per_1k"], "–"]]
    if op["matched_al"]:
        m = op["matched_al"]
        rows.append(
            [
                "matched AL",
                m["number"],
                m["mean_al"],
                m["refreshes_per_1k"],
                "refreshes " + _pct(-(op["refresh_reduction_at_matched_al"] or 0.0)),
            ]
        )
    else:
        rows.append(["matched AL", "none", None, None, "no trial reaches the reference AL"])
    if op["matched_refreshes"]:
        m = op["matched_refreshes"]
        rows.append(
            [
                "matched refreshes",
                m["number"],
                m["mean_al"],
                m["refreshes_per_1k"],
                f"AL {op['al_gain_at_matched_refreshes']:+.3f}",
            ]
        )
    else:
        rows.append(["matched refreshes", "none", None, None, "no trial refreshes as rarely as the reference"])
    out += [_table(["point", "trial", "mean AL", "refreshes / 1K", "vs reference"], rows), ""]
    out += [f"- {note}" for note in op["notes"]]
    out += [
        "",
        f"Chosen: trial {chosen['number']} ({chosen['family']}, by {op['chosen_by'].replace('_', ' ')}).",
        "",
        "```json",
        json.dumps(chosen["policy"], indent=2, sort_keys=True),
        "```",
        "",
        "## Confirmation split",
        "",
        f"{conf['n_requests']} requests never used for grids or selection. Per-request totals, paired "
        f"bootstrap over requests (`scipy.stats.bootstrap`, paired, {conf['n_resamples']} resamples, "
        f"seed {conf['seed']}), {int(100 * conf['confidence'])}% intervals.",
        "",
        _table(
            ["policy", "role", "mean AL", "refreshes / 1K", "refreshes", "tokens"],
            [
                [
                    label,
                    e["role"],
                    e["mean_al"],
                    e["refreshes_per_1k"],
                    e["refreshes_total"],
                    e["committed_total"],
                ]
                for label, e in _policies_in_order(conf)
            ],
        ),
        "",
    ]
    comp_rows = []
    for comp in conf["comparisons"]:
        comp_rows.append(
            [
                comp["name"],
                comp["baseline"],
                "refresh reduction",
                _ci_text(comp["refresh_reduction"], percent=True),
                _fmt(comp["refresh_reduction"]["excludes_zero"]) if comp["refresh_reduction"] else "–",
            ]
        )
        comp_rows.append(
            [
                comp["name"],
                comp["baseline"],
                "AL difference",
                _ci_text(comp["al_difference"]),
                _fmt(comp["al_difference"]["excludes_zero"]) if comp["al_difference"] else "–",
            ]
        )
    out += [
        _table(["comparison", "baseline", "statistic", "estimate [95% CI]", "CI excludes 0"], comp_rows),
        "",
        f"![AL by output position]({POSITION_PNG})",
        "",
        "## How to read this",
        "",
        "- AL: committed output tokens / rounds per request, macro-averaged over requests (replay of the "
        "probe traces; closed-loop fidelity is measured by `rift-ada evaluate`).",
        "- Refresh reduction: 1 − Σ refreshes(controller) / Σ refreshes(baseline) over the same requests.",
        "- Matched AL: the adaptive Pareto point with the fewest refreshes whose AL ≥ the reference "
        "periodic baseline's. Matched refreshes: the best AL among adaptive trials refreshing at most as "
        "often as the reference; the confirmation also compares with periodic refresh at the controller's "
        "own refresh rate, so a saving that plain periodic refresh gets too is not counted as a gain.",
        "- Selection-split numbers are optimistic (the best of many trials); the confirmation split is held out.",
        "",
    ]
    return "\n".join(out)


def write_report(calibration: dict[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Write the two PNG plots and ``report.md`` into ``out_dir``; returns the report path."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    plot_pareto(calibration, folder / PARETO_PNG)
    plot_al_by_position(calibration, folder / POSITION_PNG)
    return atomic_write_text(folder / "report.md", render_markdown(calibration))
