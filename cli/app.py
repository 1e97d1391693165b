"""The `rift-ada` command line: parses options, calls library functions, prints with rich."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(
    name="rift-ada",
    help="Calibrate adaptive KV-refresh controllers (RIFT-ada) for speculative-decoding drafts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()

ModelOption = Annotated[str, typer.Option("--model", "-m", help="Preset name, local directory or Hub id.")]
TempOption = Annotated[float, typer.Option("--temp", "-t", help="Sampling temperature T (0 = greedy).")]


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


class _TokenRate:
    """Progress callback: advances per request and shows output tokens per second."""

    def __init__(self, progress: Progress, task: Any):
        self.progress, self.task = progress, task
        self.tokens, self.start = 0, time.monotonic()

    def __call__(self, request_id: str, n_tokens: int) -> None:
        self.tokens += n_tokens
        rate = self.tokens / max(1e-9, time.monotonic() - self.start)
        self.progress.update(self.task, advance=1, rate=f"{rate:.1f} tok/s")


def _fail(error: Exception) -> None:
    console.print(f"[red]error:[/red] {error}")
    raise typer.Exit(code=2)


@app.command()
def models() -> None:
    """List the model presets (draft, target, default budget)."""
    from rift_ada.models import PRESETS

    table = Table(title="Model presets")
    for column in ("preset", "draft", "target", "budget", "T", "architecture", "note"):
        table.add_column(column)
    for preset in PRESETS.values():
        table.add_row(
            preset.name,
            preset.draft,
            preset.target or "(self-speculation)",
            str(preset.budget),
            str(preset.temperature),
            preset.architecture,
            preset.note,
        )
    console.print(table)


@app.command()
def datasets() -> None:
    """List the dataset specs `--dataset` accepts."""
    from rift_ada.collectors.datasets import list_datasets

    table = Table(title="Datasets")
    for column in ("name", "description", "usage"):
        table.add_column(column)
    for entry in list_datasets():
        table.add_row(entry["name"], entry["description"], entry["usage"])
    console.print(table)


@app.command()
def targets(
    model: ModelOption = "smollm2-135m",
    temp: TempOption = 0.0,
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded:small",
    out: Annotated[Path, typer.Option(help="Targets Parquet file to write.")] = Path("runs/targets.parquet"),
    seed: Annotated[int, typer.Option(help="Seed of sampling (recorded in the output).")] = 0,
    max_new_tokens: Annotated[int, typer.Option(help="Cap on output tokens per request.")] = 512,
    min_new_tokens: Annotated[int, typer.Option(help="Suppress EOS before this many tokens.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Use at most this many requests.")] = None,
    import_file: Annotated[Path | None, typer.Option("--import", help="Import responses (JSONL/Parquet).")] = None,
    device: Annotated[str, typer.Option(help="torch device (cuda for real presets).")] = "cpu",
) -> None:
    """Generate target responses (or import them) so collection can be teacher-forced on them."""
    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests

    try:
        pair = load_pair(model, device=device)
        requests = load_requests(dataset, pair.tokenizer, limit=limit)
        if import_file is not None:
            from rift_ada.collectors.targets_io import import_targets, write_targets

            rows = import_targets(
                import_file, pair.tokenizer, requests, target_model=pair.preset.target_name, temperature=temp, seed=seed
            )
            write_targets(out, rows, {"target_model": pair.preset.target_name, "temperature": temp, "seed": seed})
        else:
            with _progress() as progress:
                task = progress.add_task("targets", total=len(requests), rate="")
                rows = ensure_targets(
                    pair,
                    requests,
                    out,
                    temperature=temp,
                    seed=seed,
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=min_new_tokens,
                    on_request=_TokenRate(progress, task),
                )
    except (ValueError, OSError) as error:
        _fail(error)
    console.print(f"wrote {len(rows)} target responses to [bold]{out}[/bold]")


@app.command()
def collect(
    model: ModelOption = "smollm2-135m",
    temp: TempOption = 0.0,
    mode: Annotated[
        str, typer.Option(help="probe (all arms, teacher-forced) or closed (real draft/verify loop).")
    ] = "probe",
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded:small",
    out: Annotated[Path, typer.Option(help="Trace directory.")] = Path("runs/traces"),
    targets_file: Annotated[
        Path | None, typer.Option("--targets", help="Targets Parquet (generated if absent).")
    ] = None,
    policy: Annotated[
        list[str] | None, typer.Option(help="Closed mode: stat, periodic:N, swa, ..., or controller JSON.")
    ] = None,
    budget: Annotated[int | None, typer.Option(help="Draft KV budget B (default: the preset's).")] = None,
    sw_ratio: Annotated[float, typer.Option(help="Sliding-window share of the budget (rho).")] = 0.5,
    block_size: Annotated[int | None, typer.Option(help="Block-level selection (paged serving).")] = None,
    arm_ages: Annotated[str, typer.Option(help="Probe arm ages, comma separated.")] = "0,32,64,128,256,512,768",
    seed: Annotated[int, typer.Option(help="Seed of sampling and target generation.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Use at most this many requests.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Cap on generated target tokens.")] = 512,
    shard: Annotated[str | None, typer.Option(help="i/N: collect a deterministic part of the requests.")] = None,
    device: Annotated[str, typer.Option(help="torch device (cuda for real presets).")] = "cpu",
) -> None:
    """Collect probe traces or closed-loop runs into a trace directory (resumable, shardable)."""
    from rift_ada.collectors.collect import CollectSettings
    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests, run_collection

    try:
        pair = load_pair(model, device=device)
        requests = load_requests(dataset, pair.tokenizer, limit=limit)
        settings = CollectSettings(
            draft=pair.preset.draft,
            target=pair.preset.target_name,
            temperature=temp,
            seed=seed,
            budget=budget or pair.preset.budget,
            sw_ratio=sw_ratio,
            block_size=block_size,
            arm_ages=tuple(int(age) for age in arm_ages.split(",")),
            dataset=dataset,
        )
        with _progress() as progress:
            targets_path = targets_file or out.parent / f"{out.name}-targets.parquet"
            task = progress.add_task("targets", total=len(requests), rate="")
            rows = ensure_targets(
                pair,
                requests,
                targets_path,
                temperature=temp,
                seed=seed,
                max_new_tokens=max_new_tokens,
                on_request=_TokenRate(progress, task),
            )
            progress.update(task, completed=len(requests))
            task = progress.add_task(f"collect {mode}", total=len(requests), rate="")
            summary = run_collection(
                pair,
                requests,
                rows,
                out,
                settings,
                mode=mode,
                policies=policy or [],
                shard=shard,
                on_request=_TokenRate(progress, task),
            )
    except (ValueError, OSError) as error:
        _fail(error)
    console.print(
        f"{summary.mode}: {summary.collected} requests collected, {summary.skipped} already complete, "
        f"{summary.output_tokens} output tokens -> [bold]{summary.out_dir}[/bold]"
    )


@app.command()
def evaluate(
    traces: Annotated[Path, typer.Option(help="Probe trace directory to replay.")],
    policy: Annotated[
        list[str] | None, typer.Option(help="stat, full, periodic:N or a controller JSON (repeat).")
    ] = None,
    closed: Annotated[
        Path | None, typer.Option(help="Closed-loop run directory: print replay-vs-closed fidelity.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
) -> None:
    """Replay policies on probe traces (and compare with a closed-loop run of the same policies)."""
    from rift_ada.calibrate.evaluation import evaluate_run

    try:
        results = evaluate_run(traces, policy or ["stat", "periodic:128", "full"], closed_dir=closed)
    except (ValueError, OSError) as error:
        _fail(error)
    table = Table(title=f"Replay on {traces}")
    for column in ("policy", "mean AL", "% of full", "refreshes / 1K", "closed AL", "closed ref/1K", "AL gap"):
        table.add_column(column)
    for row in results["policies"]:
        fid = row.get("fidelity") or {}
        table.add_row(
            row["policy"],
            f"{row['mean_al']:.3f}",
            _pct(row.get("al_fraction_of_full")),
            f"{row['refreshes_per_1k']:.2f}",
            _num(fid.get("closed_mean_al")),
            _num(fid.get("closed_refreshes_per_1k"), 2),
            _num(fid.get("al_gap")),
        )
    console.print(table)
    if out is not None:
        from rift_ada.collectors.collect import save_json

        save_json(out, results)
        console.print(f"wrote {out}")


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


@app.command()
def calibrate(
    model: ModelOption,
    temp: TempOption,
    traces: Annotated[
        Path | None, typer.Option(help="Probe trace directory (default runs/<model>-T<temp>/probe).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory for report, study and controller.")] = None,
    controller_out: Annotated[Path | None, typer.Option("--controller", help="Controller JSON path.")] = None,
    trials: Annotated[int, typer.Option(help="Search trials (baselines come on top).")] = 200,
    timeout: Annotated[float | None, typer.Option(help="Stop the study after this many seconds.")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL (default: SQLite in the run dir).")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes filling the study.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of splits, sampler and bootstrap.")] = 0,
    reference_interval: Annotated[int, typer.Option(help="Periodic Δ whose AL the controller must match.")] = 128,
    margin: Annotated[
        float, typer.Option(help="Non-inferiority margin of 'AL kept', a fraction of the reference AL.")
    ] = 0.01,
    confirm: Annotated[
        str, typer.Option(help="replay, or closed: rerun the controller and its baselines in the real loop.")
    ] = "replay",
) -> None:
    """Calibrate a controller on probe traces: grids, Optuna study, bootstrap CIs, JSON + report."""
    from rift_ada.calibrate.pipeline import calibrate as run_calibration
    from rift_ada.calibrate.pipeline import check_traces_match
    from rift_ada.collectors.trace_io import manifest_hash, read_probe_traces
    from rift_ada.models import resolve_preset

    name = f"{model}-T{temp:g}"
    traces = traces or Path("runs") / name / "probe"
    out = out or Path("runs") / name / "calibration"
    if confirm not in ("replay", "closed"):
        _fail(ValueError(f"--confirm: expected replay or closed, got {confirm!r}"))
    controller_out = controller_out or Path("controllers") / f"{name}.json"
    try:
        preset = resolve_preset(model)
        probe = read_probe_traces(traces)
        check_traces_match(probe.manifest, preset.draft, preset.target_name, temp)
        with _progress() as progress:
            task = progress.add_task("calibrate", total=None, rate="")

            def report(stage: str, done: int, total: int | None) -> None:
                progress.update(task, description=stage, completed=done, total=total)

            result = run_calibration(
                probe,
                out,
                name=name,
                draft=preset.draft,
                target=preset.target_name,
                temperature=temp,
                trials=trials,
                timeout=timeout,
                storage=storage,
                workers=workers,
                seed=seed,
                reference_interval=reference_interval,
                manifest_hash=manifest_hash(traces),
                progress=report,
                margin=margin,
            )
            if confirm == "closed":
                import json

                from rift_ada.calibrate.confirm import confirm_closed_from_traces

                progress.update(task, description="closed-loop confirmation", completed=0, total=None)
                confirm_closed_from_traces(out, traces, model=model, margin=margin)
                result.calibration = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
                result.controller = json.loads(result.controller_path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:
        _fail(error)
    from rift_ada.calibrate.export import export_controller

    export_controller(result.controller, controller_out)
    confirmation = result.calibration["confirmation"]
    table = Table(title=f"Confirmation split ({confirmation['n_requests']} requests, paired bootstrap 95% CI)")
    for column in ("comparison", "baseline", "refresh reduction", "AL difference"):
        table.add_column(column)
    for comparison in confirmation.get("closed_loop", confirmation)["comparisons"]:
        reduction, difference = comparison["refresh_reduction"], comparison["al_difference"]
        table.add_row(
            comparison["name"], comparison["baseline"],
            "-" if not reduction else f"{100 * reduction['estimate']:.1f}% [{100 * (reduction['low'] or 0):.1f}, {100 * (reduction['high'] or 0):.1f}]",
            f"{difference['estimate']:+.3f} [{difference['low'] or 0:+.3f}, {difference['high'] or 0:+.3f}]",
        )
    console.print(f"splits: {result.split_sizes}")
    console.print(table)
    console.print(confirmation["verdict"]["text"])
    console.print(f"controller: [bold]{controller_out}[/bold]   report: [bold]{out / 'report.md'}[/bold]")


@app.command()
def show(path: Annotated[Path, typer.Argument(help="Controller JSON file.")]) -> None:
    """Validate and pretty-print a controller as a rule tree."""
    from rift_ada.controller import Controller, ControllerError
    from rift_ada.policies.render import render_controller

    try:
        controller = Controller.load(path)
    except ControllerError as error:
        _fail(error)
    console.print(render_controller(controller.to_dict()))


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="Demo or calibration run directory.")] = Path("runs/demo"),
) -> None:
    """Print a run's report.md in the terminal."""
    from rich.markdown import Markdown

    path = run / "report.md" if run.is_dir() else run
    if not path.exists():
        _fail(FileNotFoundError(f"{path}: no report here (run `rift-ada demo` or `rift-ada calibrate` first)"))
    console.print(Markdown(path.read_text()))


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Run directory.")] = Path("runs/demo"),
    size: Annotated[str, typer.Option(help="tiny (smoke test), small (default, ~15 min on 2 cores) or full.")] = "small",
    model: ModelOption = "smollm2-135m",
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded",
    seed: Annotated[int, typer.Option(help="Seed of every random choice (recorded in demo.json).")] = 0,
) -> None:
    """The whole pipeline on the embedded SmolLM2-135M: dataset, targets, probe, calibrate, closed loop, report."""
    from rift_ada.calibrate.demo import DEMO_SIZES, run_demo

    if size not in DEMO_SIZES:
        _fail(ValueError(f"--size must be one of {', '.join(DEMO_SIZES)}"))
    with _progress() as progress:
        tasks: dict[str, Any] = {}

        def step(stage: str, done: int, total: int | None) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total, rate="")
            progress.update(tasks[stage], completed=done, total=total)

        try:
            summary = run_demo(out, size=size, model=model, dataset=dataset, seed=seed, progress=step)
        except (ValueError, OSError) as error:
            _fail(error)
    console.print(summary["table"])
    console.print(f"report: [bold]{summary['report']}[/bold]")
    for label, path in summary["controllers"].items():
        console.print(f"controller ({label}): [bold]{path}[/bold]")


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":
    main()
