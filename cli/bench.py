"""`rift-ada bench`: the benchmark run behind docs/results.md (probe, calibrate, closed-loop confirmation, oracle)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.text import Text

from rift_ada.cli._common import check_dataset, check_model, check_writable, console, progress_reporter
from rift_ada.cli._options import DEFAULT_SCORER, ModelOption, ScorerOption
from rift_ada.throughput import CLOSED_BATCH, PROBE_BATCH, PROBE_POSITION_BUDGET

BenchSizeName = Literal["tiny", "small", "full"]  # the keys of experiments.bench.BENCH_SIZES (a test keeps them equal)
OUT_HELP = "Run directory (re-running continues where it stopped)."


def _numbers(text: str | None, name: str, kind: type) -> tuple | None:
    if text is None:
        return None
    try:
        return tuple(kind(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated numbers, got {text!r}") from None


def bench(
    out: Annotated[Path, typer.Option(help="Run directory (re-running continues where it stopped).")] = Path(
        "runs/bench"
    ),
    size: Annotated[
        BenchSizeName, typer.Option(help="full (36 requests x 768 tokens, 3 budgets, T = 0 and 1), small or tiny.")
    ] = "full",
    model: Annotated[
        str, typer.Option("--model", "-m", help="Preset name, local directory or Hub id.")
    ] = "smollm2-135m",
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded",
    requests: Annotated[int | None, typer.Option(help="Requests (default: the size's).")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="Output tokens per request.")] = None,
    budgets: Annotated[str | None, typer.Option(help="Draft KV budgets, comma separated, e.g. 128,256,512.")] = None,
    temperatures: Annotated[str | None, typer.Option(help="Temperatures, comma separated, e.g. 0,1.")] = None,
    trials: Annotated[int | None, typer.Option(help="Optuna trials per (temperature, budget) cell.")] = None,
    max_isl: Annotated[int | None, typer.Option(help="Longest prompt (tokens) a request may have.")] = None,
    arm_ages: Annotated[str | None, typer.Option(help="Probe arm ages, comma separated (multiples of 8).")] = None,
    max_age: Annotated[int | None, typer.Option(help="Controller schedule max_age (<= the oldest arm).")] = None,
    table_requests: Annotated[
        int | None, typer.Option(help="Confirmation requests running every Table 1 method (default: all; 0: none).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            help=f"Requests per batched forward of the targets and the closed loop (default {CLOSED_BATCH} in every "
            "dtype)."
        ),
    ] = None,
    probe_batch_size: Annotated[
        int | None,
        typer.Option(
            help=f"Requests stacked in one probe forward (default {PROBE_BATCH}, fewer while their prompt and "
            f"response positions would pass {PROBE_POSITION_BUDGET})."
        ),
    ] = None,
    confirm_extra: Annotated[
        int | None,
        typer.Option(
            help="Confirmation-only requests beside the split's (closed loop only). Raise it to extend a finished "
            "run: finished stages are read back, only the new requests run."
        ),
    ] = None,
    free_running: Annotated[
        bool,
        typer.Option(
            help="T > 0 closed loop: real rejection sampling, each policy its own text, instead of teacher forcing "
            "every policy on the target responses (same law, paired texts)."
        ),
    ] = False,
    forced_length: Annotated[
        bool,
        typer.Option(
            help="Force every target response to --output-tokens with EOS suppressed (the workload before "
            "2026-12-01) instead of ending it at EOS or the cap."
        ),
    ] = False,
    scorer: ScorerOption = DEFAULT_SCORER,
    seed: Annotated[int, typer.Option(min=0, max=2**31 - 1, help="Seed of every random choice (in bench.json).")] = 0,
    device: Annotated[str, typer.Option(help="torch device (cuda on a GPU machine).")] = "cpu",
    dtype: Annotated[
        str | None,
        typer.Option(
            help="float32 (CPU default) or bfloat16: faster on a CPU, but replay then misses the closed loop by a "
            "few % (docs/performance.md)."
        ),
    ] = None,
    results: Annotated[Path | None, typer.Option(help="Also write this results page (e.g. docs/results.md).")] = None,
    export_controllers: Annotated[
        Path | None,
        typer.Option(
            help="Copy each cell's calibrated controller here (e.g. data/controllers); where it reads query_drift, "
            "also calibrate, confirm and copy one without it (<name>-engine.json, for engines)."
        ),
    ] = None,
) -> None:
    """The benchmark: per temperature and budget, calibrate, confirm in the closed loop, compare with the oracle."""
    from rift_ada.cli._errors import fail
    from rift_ada.experiments.bench import bench_size, run_bench
    from rift_ada.experiments.bench import export_controllers as export
    from rift_ada.experiments.bench_report import write_results

    try:
        chosen = bench_size(
            size,
            n_requests=requests,
            output_tokens=output_tokens,
            budgets=_numbers(budgets, "--budgets", int),
            temperatures=_numbers(temperatures, "--temperatures", float),
            trials=trials,
            max_isl=max_isl,
            arm_ages=_numbers(arm_ages, "--arm-ages", int),
            max_age=max_age,
            table_requests=table_requests,
            batch_size=CLOSED_BATCH if batch_size is None else batch_size,
            probe_batch_size=probe_batch_size,
            free_running=free_running,
            forced_length=forced_length or None,
            confirm_extra=confirm_extra,
            scorer=scorer,
        )
    except ValueError as error:  # a bad size: a usage error, before any model loads
        fail(error, code=2)
    check_model(model)
    check_dataset(dataset)
    check_writable(out / "bench.json", "--out", root=out)
    if results is not None:
        check_writable(results, "--results")
    if export_controllers is not None:
        check_writable(export_controllers / "controller.json", "--export-controllers", root=export_controllers)
    given = {
        "--size": size, "--model": model, "--dataset": dataset, "--out": out, "--requests": requests,
        "--output-tokens": output_tokens, "--budgets": budgets, "--temperatures": temperatures, "--trials": trials,
        "--max-isl": max_isl, "--arm-ages": arm_ages, "--max-age": max_age,
        "--table-requests": table_requests, "--batch-size": batch_size,
        "--probe-batch-size": probe_batch_size, "--confirm-extra": confirm_extra,
        "--seed": seed, "--device": device,
        "--dtype": dtype, "--results": results, "--export-controllers": export_controllers,
        "--scorer": None if scorer == DEFAULT_SCORER else scorer,
    }  # fmt: skip
    command = (
        "rift-ada bench "
        + " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in given.items() if value is not None)
        + (" --free-running" if free_running else "")
        + (" --forced-length" if forced_length else "")
    )
    try:
        with progress_reporter() as progress:
            outcome = run_bench(
                out, size=chosen, model=model, seed=seed, dataset=dataset, device=device, dtype=dtype,
                progress=progress.stage_callback(), token_progress=progress.tokens_callback, command=command,
                engine_controllers=export_controllers is not None,
            )  # fmt: skip
    except (ValueError, OSError) as error:
        fail(error)
    console.print(Text.assemble("report: ", (outcome["report"], "bold")))
    if results is not None:
        console.print(Text.assemble("results: ", (str(write_results(outcome["bench"], out, results)), "bold")))
    if export_controllers is not None:
        for path in export(outcome["bench"], export_controllers):
            console.print(Text.assemble("controller: ", (str(path), "bold")))


def demo(
    out: Annotated[Path, typer.Option(help=OUT_HELP)] = Path("runs/demo"),
    size: Annotated[
        BenchSizeName,
        typer.Option(help="small (default: T = 1, B = 128, ~5 min on 2 cores), tiny (smoke test) or full (hours)."),
    ] = "small",
    model: ModelOption = "smollm2-135m",
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded",
    seed: Annotated[int, typer.Option(min=0, max=2**31 - 1, help="Seed of every random choice (in bench.json).")] = 0,
) -> None:
    """The whole pipeline on the embedded SmolLM2-135M: `rift-ada bench` at the small size (see its report)."""
    bench(out=out, size=size, model=model, dataset=dataset, seed=seed)


def register(app: typer.Typer) -> None:
    """Add `bench` and `demo` to the `rift-ada` app."""
    app.command("bench")(bench)
    app.command("demo")(demo)
