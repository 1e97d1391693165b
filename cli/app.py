"""The `rift-ada` command line: parses options, calls library functions, prints with rich.

Every option is checked before any model loads (bad options exit 2 with the option named on
stderr); errors a user can cause end as one plain line on stderr with exit 1 (cli/_errors.py);
progress goes to stderr, as bars on a terminal and as log lines elsewhere (cli/_progress.py).
The console, the progress reporter and the checks other command modules share are in cli/_common.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rift_ada.cli._common import check_dataset, check_model, check_writable, console, progress_reporter
from rift_ada.cli._errors import ReportingGroup, bad_option, describe_error, fail, note_output
from rift_ada.cli._options import DEFAULT_SCORER, ModelOption, ScorerOption
from rift_ada.cli._progress import ProgressReporter
from rift_ada.collectors.probe_traces import DEFAULT_ARM_AGES
from rift_ada.throughput import CLOSED_BATCH, PROBE_BATCH, PROBE_POSITION_BUDGET, TARGETS_BATCH, default_batch

_DEFAULT_ARM_AGES = ",".join(map(str, DEFAULT_ARM_AGES))

app = typer.Typer(
    name="rift-ada",
    help="Calibrate adaptive KV-refresh controllers (RIFT-ada) for speculative-decoding drafts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=ReportingGroup,
    rich_markup_mode=None,  # usage errors as plain `Error: ...` lines on stderr, never parsed as markup
)

TempOption = Annotated[float, typer.Option("--temp", "-t", min=0.0, help="Sampling temperature T (0 = greedy).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.")]
DeviceMapOption = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help="Spread a model over several GPUs (transformers device_map, e.g. auto; needs accelerate). "
        "Recorded in the manifest.",
    ),
]
DtypeOption = Annotated[
    Literal["float32", "bfloat16", "float16"] | None,
    typer.Option(
        help="Model dtype (default: float32 on CPU, bfloat16 elsewhere). On a CPU, bfloat16 runs faster but replay "
        "then misses the closed loop by a few % (docs/performance.md). Recorded in the manifest."
    ),
]
BatchSizeOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Responses generated together; default 16 in float32, 32 in bfloat16 / float16 (half the KV bytes a row).",
    ),
]
ClosedBatchSizeOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Closed mode: request x policy runs decoded together, a finished run's slot going to the next; also the "
        f"targets it generates (default {CLOSED_BATCH} in every dtype: a teacher-forced closed loop holds the draft's "
        "KV only).",
    ),
]
MAX_SEED = 2**31 - 1  # seeds reach torch, numpy and Optuna; all take this range


def _token_counter(progress: ProgressReporter, stage: str, total: int | None = None) -> Callable[[int], None]:
    """An ``on_token(token)`` callback (target generation) counting each generated token on ``stage``."""
    committed = progress.tokens_callback(stage, total)
    return lambda token: committed(1, 0)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"rift-ada {version('rift-ada')}")
        except PackageNotFoundError:
            typer.echo("rift-ada (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Calibrate adaptive KV-refresh controllers (RIFT-ada) for speculative-decoding drafts."""
    from rift_ada.memory import cap_heap_growth

    cap_heap_growth()  # long probes and loops otherwise grow glibc's heap by GBs (rift_ada/memory.py)


# ----------------------------------------------------------------------------------------------
# Checks run before any model loads: each raises a usage error (exit 2) naming the option.


def _share(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"must be in (0, 1], got {value}")
    return value


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0, got {value}")
    return value


def _check_shard(shard: str | None) -> str | None:
    """``i/N``, or ``auto`` resolved from SLURM / Kubernetes / torchrun / Ray variables; the shard to use."""
    if shard is None:
        return None
    from rift_ada.collectors.cluster import resolve_shard
    from rift_ada.collectors.trace_io import parse_shard

    try:
        resolved = resolve_shard(shard)
        parse_shard(resolved)
    except ValueError as error:
        bad_option("--shard", str(error))
    return resolved


def _check_arm_ages(text: str, decision_stride: int = 8) -> tuple[int, ...]:
    try:
        ages = tuple(int(item) for item in text.split(","))
    except ValueError:
        bad_option("--arm-ages", f"expected comma-separated integers, got {text!r}")
    if any(age < 0 for age in ages):
        bad_option("--arm-ages", f"ages must be >= 0, got {text!r}")
    if any(age % decision_stride for age in ages):
        bad_option("--arm-ages", f"ages must be multiples of the decision stride {decision_stride}, got {text!r}")
    if list(ages) != sorted(set(ages)):
        bad_option("--arm-ages", f"ages must be strictly increasing, got {text!r}")
    return ages


def _check_input_file(path: Path | None, option: str) -> None:
    if path is not None and not path.is_file():
        bad_option(option, f"{path}: no such file")


@app.command()
def models(json_output: JsonOption = False) -> None:
    """List the model presets (draft, target, default budget)."""
    from rift_ada.models import PRESETS

    if json_output:
        _print_json([preset.to_dict() for preset in PRESETS.values()])
        return
    table = Table(title="Model presets")
    for column in ("preset", "draft", "target", "budget", "T", "architecture", "note"):
        table.add_column(column, **_full_width(column, [p.name for p in PRESETS.values()], "preset"))
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
    _print_table(table)


def _full_width(column: str, values: list[str], typed: str) -> dict[str, Any]:
    """Column options: the column a user must type from never wraps or truncates."""
    if column != typed:
        return {"overflow": "fold"}
    return {"no_wrap": True, "min_width": max([len(column), *(len(v) for v in values)])}


def _print_table(table: Table) -> None:
    """Tables as plain text (cells never parsed as markup)."""
    console.print(table)


def _text(value: Any) -> Text:
    """A table cell or line from user data: printed as-is, never parsed as markup."""
    return Text(str(value))


@app.command()
def datasets(json_output: JsonOption = False) -> None:
    """List the dataset specs `--dataset` accepts."""
    from rift_ada.collectors.datasets import list_datasets

    entries = list_datasets()
    if json_output:
        _print_json(entries)
        return
    table = Table(title="Datasets")
    for column in ("name", "description", "usage"):
        table.add_column(column, **_full_width(column, [e["name"] for e in entries], "name"))
    for entry in entries:
        table.add_row(entry["name"], entry["description"], entry["usage"])
    _print_table(table)


@app.command()
def targets(
    model: ModelOption = "smollm2-135m",
    temp: TempOption = 0.0,
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded:small",
    out: Annotated[Path, typer.Option(help="Targets Parquet file to write.")] = Path("runs/targets.parquet"),
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of sampling (recorded in the output).")] = 0,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Cap on output tokens per request.")] = 512,
    min_new_tokens: Annotated[int, typer.Option(min=0, help="Suppress EOS before this many tokens.")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="Use at most this many requests.")] = None,
    import_file: Annotated[
        Path | None, typer.Option("--import", help="Import responses (JSONL/Parquet); loads only the tokenizer.")
    ] = None,
    device: Annotated[str, typer.Option(help="torch device (cuda for real presets).")] = "cpu",
    device_map: DeviceMapOption = None,
    shard: Annotated[
        str | None, typer.Option(help="i/N or auto (SLURM/Kubernetes/torchrun env): this shard's responses only.")
    ] = None,
    extend_targets: Annotated[
        bool, typer.Option(help="Add responses missing from an existing --out file (never changes its rows).")
    ] = False,
    batch_size: BatchSizeOption = None,
    dtype: DtypeOption = None,
) -> None:
    """Generate target responses (or import them) so collection can be teacher-forced on them."""
    preset = check_model(model)
    batch_size = default_batch(TARGETS_BATCH, dtype, device) if batch_size is None else batch_size
    shard = _check_shard(shard)
    check_dataset(dataset)
    _check_input_file(import_file, "--import")
    if min_new_tokens > max_new_tokens:
        bad_option("--min-new-tokens", f"must be <= --max-new-tokens ({max_new_tokens}), got {min_new_tokens}")
    check_writable(out, "--out")
    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests

    if import_file is not None:
        from rift_ada.collectors.targets.files import import_targets, write_targets
        from rift_ada.models import load_tokenizer

        tokenizer = load_tokenizer(preset.draft)
        requests = load_requests(dataset, tokenizer, limit=limit)
        rows = import_targets(
            import_file, tokenizer, requests, target_model=preset.target_name, temperature=temp, seed=seed
        )
        write_targets(out, rows, {"target_model": preset.target_name, "temperature": temp, "seed": seed})
    else:
        pair = load_pair(model, device=device, device_map=device_map, dtype=dtype)
        requests = load_requests(dataset, pair.tokenizer, limit=limit)
        if shard is not None and not out.exists():
            from rift_ada.collectors.targets.store import generate_targets_resumable

            with progress_reporter() as progress:
                done = generate_targets_resumable(
                    pair.target_for_generation,
                    pair.tokenizer,
                    requests,
                    out,
                    target_name=pair.preset.target_name,
                    temperature=temp,
                    seed=seed,
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=min_new_tokens,
                    shard=shard,
                    batch_size=batch_size,
                    on_request=progress.request_callback(f"targets {shard}", None),
                    on_token=_token_counter(progress, f"targets {shard}"),
                )
            console.print(_text(f"shard {shard}: {done.generated} responses generated, {done.skipped} already there"))
            if not done.complete:
                console.print("other shards are not finished: the last one to finish writes the targets file")
                return
            rows = done.rows or []
        else:
            with progress_reporter() as progress:
                rows = ensure_targets(
                    pair,
                    requests,
                    out,
                    temperature=temp,
                    seed=seed,
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=min_new_tokens,
                    extend=extend_targets,
                    batch_size=batch_size,
                    on_request=progress.request_callback("targets", len(requests)),
                    on_token=_token_counter(progress, "targets", len(requests)),
                )
    console.print(Text.assemble(f"wrote {len(rows)} target responses to ", (str(out), "bold")))


@app.command()
def collect(
    model: ModelOption = "smollm2-135m",
    temp: TempOption = 0.0,
    mode: Annotated[
        Literal["probe", "closed"],
        typer.Option(help="probe (all arms, teacher-forced) or closed (real draft/verify loop)."),
    ] = "probe",
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded:small",
    out: Annotated[Path, typer.Option(help="Trace directory.")] = Path("runs/traces"),
    targets_file: Annotated[
        Path | None,
        typer.Option("--targets", help="Targets Parquet (generated if absent; default: OUT/targets.parquet)."),
    ] = None,
    policy: Annotated[
        list[str] | None, typer.Option(help="Closed mode: stat, periodic:N, swa, ..., or controller JSON.")
    ] = None,
    budget: Annotated[int | None, typer.Option(min=1, help="Draft KV budget B (default: the preset's).")] = None,
    sw_ratio: Annotated[
        float, typer.Option(callback=_share, help="Sliding-window share of the budget (rho), in (0, 1].")
    ] = 0.5,
    block_size: Annotated[int | None, typer.Option(min=1, help="Block-level selection (paged serving).")] = None,
    scorer: ScorerOption = DEFAULT_SCORER,
    arm_ages: Annotated[str, typer.Option(help="Probe arm ages, comma separated.")] = _DEFAULT_ARM_AGES,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of sampling and target generation.")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="Use at most this many requests.")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Cap on generated target tokens.")] = 512,
    shard: Annotated[
        str | None, typer.Option(help="i/N, or auto (SLURM array, Kubernetes Indexed Job, torchrun/Ray env).")
    ] = None,
    device: Annotated[str, typer.Option(help="torch device (cuda for real presets).")] = "cpu",
    device_map: DeviceMapOption = None,
    extend_targets: Annotated[
        bool, typer.Option(help="Add responses missing from an existing --targets file (never changes its rows).")
    ] = False,
    batch_size: ClosedBatchSizeOption = None,
    probe_batch_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Probe mode: requests whose arms share each forward (default {PROBE_BATCH}, fewer while their "
            f"prompt and response positions would pass {PROBE_POSITION_BUDGET}: each holds every arm's KV, "
            "docs/performance.md).",
        ),
    ] = None,
    free_running: Annotated[
        bool, typer.Option(help="Closed mode at T > 0: real rejection sampling instead of teacher forcing.")
    ] = False,
    dtype: DtypeOption = None,
) -> None:
    """Collect probe traces or closed-loop runs into a trace directory (resumable, shardable)."""
    preset = check_model(model)
    batch_size = CLOSED_BATCH if batch_size is None else batch_size
    shard = _check_shard(shard)
    ages = _check_arm_ages(arm_ages)
    check_dataset(dataset)
    from rift_ada.collectors.collect import CollectSettings, resolve_closed_policy

    settings = CollectSettings(
        draft=preset.draft,
        target=preset.target_name,
        temperature=temp,
        seed=seed,
        budget=preset.budget if budget is None else budget,
        sw_ratio=sw_ratio,
        block_size=block_size,
        scorer=scorer,
        arm_ages=ages,
        dataset=dataset,
    )
    try:
        settings.cache_policy("rift-stat")
    except ValueError as error:
        bad_option("--budget", str(error))
    if mode == "closed":
        if not policy:
            bad_option("--policy", "closed mode needs at least one policy (e.g. --policy stat --policy periodic:128)")
        labels = []
        for spec in policy:
            try:
                labels.append(resolve_closed_policy(spec, settings).label)
            except ValueError as error:
                bad_option("--policy", str(error))
        if len(set(labels)) != len(labels):
            bad_option("--policy", f"duplicate policies {labels}")
    elif policy:
        bad_option("--policy", "only --mode closed runs policies (probe mode records every arm)")
    if free_running and mode != "closed":
        bad_option("--free-running", "applies to --mode closed only")
    if probe_batch_size is not None and mode != "probe":
        bad_option("--probe-batch-size", "applies to --mode probe only (closed mode: --batch-size)")
    if free_running and temp <= 0:
        bad_option("--free-running", "needs --temp > 0 (at T = 0 teacher forcing is exact)")
    check_writable(out / "manifest.json", "--out", root=out)
    if targets_file is not None:
        note_output(targets_file, "--targets")  # generated there when absent
    from rift_ada.collectors.pipeline import ensure_targets, load_pair, load_requests, run_collection
    from rift_ada.collectors.targets.files import targets_provenance

    pair = load_pair(model, device=device, device_map=device_map, dtype=dtype)
    requests = load_requests(dataset, pair.tokenizer, limit=limit)
    with progress_reporter() as progress:
        targets_path = targets_file or _default_targets(out)
        rows = ensure_targets(
            pair,
            requests,
            targets_path,
            temperature=temp,
            seed=seed,
            max_new_tokens=max_new_tokens,
            extend=extend_targets,
            shard=shard,
            batch_size=batch_size,
            on_request=progress.request_callback("targets", len(requests)),
            on_token=_token_counter(progress, "targets", len(requests)),
        )
        progress.complete("targets")
        summary = run_collection(
            pair,
            requests,
            rows,
            out,
            settings,
            mode=mode,
            policies=policy or [],
            shard=shard,
            on_request=progress.request_callback(f"collect {mode}", len(requests)),
            on_tokens=progress.tokens_callback(f"collect {mode}", len(requests)),
            batch_size=batch_size,
            probe_batch_size=PROBE_BATCH if probe_batch_size is None else probe_batch_size,
            free_running=free_running,
            extra_manifest={
                "targets": targets_provenance(targets_path),
                "dtype": str(pair.draft.dtype).removeprefix("torch."),
                **({"device_map": device_map} if device_map else {}),
            },
        )
    console.print(
        Text.assemble(
            f"{summary.mode}: {summary.collected} requests collected, {summary.skipped} already complete, "
            f"{summary.output_tokens} output tokens -> ",
            (str(summary.out_dir), "bold"),
        )
    )


def _default_targets(out: Path) -> Path:
    """``collect``'s targets without ``--targets``: inside the trace directory (a sibling
    ``<out>-targets.parquet`` written by earlier versions is still read where it exists)."""
    legacy = out.parent / f"{out.name}-targets.parquet"
    inside = out / "targets.parquet"
    return legacy if legacy.exists() and not inside.exists() else inside


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
    json_output: JsonOption = False,
    allow_partial: Annotated[
        bool, typer.Option(help="Use a collection with fewer committed requests than its manifest lists.")
    ] = False,
) -> None:
    """Replay policies on probe traces (and compare with a closed-loop run of the same policies)."""
    from rift_ada.collectors.trace_io import check_complete, read_manifest
    from rift_ada.experiments.evaluation import evaluate_run
    from rift_ada.policies.evaluate import resolve_policy_spec

    specs = policy or ["stat", "periodic:128", "full"]
    for spec in specs:
        try:
            resolve_policy_spec(spec)
        except ValueError as error:
            bad_option("--policy", str(error))
    for option, directory, wanted in (("--traces", traces, "probe"), ("--closed", closed, "closed")):
        if directory is None:
            continue
        try:
            mode = read_manifest(directory)["mode"]
        except ValueError as error:
            bad_option(option, str(error))
        if mode != wanted:
            bad_option(option, f"{directory} holds {mode} traces; {option} takes a {wanted} trace directory")
    if out is not None:
        check_writable(out, "--out")
    for directory in (traces, closed):
        if directory is not None:
            _report_partial(check_complete(directory, allow_partial=allow_partial), directory)
    results = evaluate_run(traces, specs, closed_dir=closed)
    if out is not None:
        from rift_ada.atomic import atomic_write_json, json_safe

        atomic_write_json(out, json_safe(results))
    if json_output:
        _print_json(results)
        return
    table = Table(title=Text(f"Replay on {traces}"))
    labels = [str(row["policy"]) for row in results["policies"]]
    for column in ("policy", "mean AL", "% of full", "refreshes / 1K", "closed AL", "closed ref/1K", "AL gap"):
        table.add_column(column, **_full_width(column, labels, "policy"))
    for row in results["policies"]:
        fid = row.get("fidelity") or {}
        table.add_row(
            _text(row["policy"]),
            f"{row['mean_al']:.3f}",
            _pct(row.get("al_fraction_of_full")),
            f"{row['refreshes_per_1k']:.2f}",
            _num(fid.get("closed_mean_al")),
            _num(fid.get("closed_refreshes_per_1k"), 2),
            _num(fid.get("al_gap")),
        )
    _print_table(table)
    if out is not None:
        console.print(_text(f"wrote {out}"))


def _report_partial(status: dict[str, Any], trace_dir: Path) -> None:
    """Say so (on stderr) when an allowed partial collection is used."""
    if status.get("partial"):
        from rift_ada.cli._errors import stderr_console

        stderr_console.print(
            _text(
                f"partial collection: {status['n_requests_committed']} of "
                f"{status['n_requests_expected']} requests committed in {trace_dir}"
            )
        )


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _calibration_config(**settings: Any) -> Any:
    """The ``CalibrationConfig`` of these settings; a setting it refuses is a usage error naming its option."""
    from rift_ada.calibrate.config import CalibrationConfig, ConfigError

    try:
        return CalibrationConfig(**settings)
    except ConfigError as error:  # every field the command sets is the option of the same name
        bad_option(f"--{error.field.replace('_', '-')}", str(error))


def _check_block_size(block_size: int | None, manifest: dict[str, Any], traces: Path) -> None:
    """A controller's selection granularity is the one its traces were collected with: check it matches."""
    if block_size is None:
        return
    collected = (manifest.get("cache") or {}).get("block_size")
    if collected != block_size:
        shown = "position level (block_size null)" if collected is None else f"block_size {collected}"
        bad_option(
            "--block-size",
            f"the traces {traces} were collected at {shown}; collect them with `rift-ada collect --block-size "
            f"{block_size}` for a controller at the engine's page size",
        )


@app.command()
def calibrate(
    model: ModelOption,
    temp: TempOption,
    traces: Annotated[
        Path | None, typer.Option(help="Probe trace directory (default runs/<model>-T<temp>/probe).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Run directory: report, study.db, calibration.json, controller.json (default runs/<model>-T<temp>/calibration)."
        ),
    ] = None,
    controller_out: Annotated[
        Path | None,
        typer.Option(
            "--controller",
            help="Controller JSON path (default: OUT/controller.json with --out, else controllers/<model>-T<temp>.json).",
        ),
    ] = None,
    trials: Annotated[int, typer.Option(min=0, help="Search trials (baselines come on top).")] = 200,
    timeout: Annotated[
        float | None, typer.Option(callback=_positive, help="Stop the study after this many seconds.")
    ] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL (default: SQLite in the run dir).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes filling the study.")] = 1,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of splits, sampler and bootstrap.")] = 0,
    reference_interval: Annotated[
        int, typer.Option(min=1, help="Periodic Δ whose AL the controller must match.")
    ] = 128,
    json_output: JsonOption = False,
    allow_partial: Annotated[
        bool, typer.Option(help="Use a collection with fewer committed requests than its manifest lists.")
    ] = False,
    margin: Annotated[
        float, typer.Option(min=0.0, help="Non-inferiority margin of 'AL kept', a fraction of the reference AL.")
    ] = 0.01,
    confirm: Annotated[
        Literal["replay", "closed"],
        typer.Option(
            help="replay, or closed: rerun the controller and its baselines in the real loop (loads the model)."
        ),
    ] = "replay",
    free_running: Annotated[
        bool,
        typer.Option(
            help="With --confirm closed at T > 0: real rejection sampling, each policy its own text, instead of "
            "teacher forcing every policy on the target responses (same law, paired texts)."
        ),
    ] = False,
    signals: Annotated[
        str | None,
        typer.Option(
            help="Signals the search may use, comma separated (default: all the traces carry), e.g. "
            "acceptance,entropy,acceptance_drop,entropy_rise for an engine without query summaries."
        ),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The engine's KV page size (vLLM --block-size, SGLang --page-size, TRT-LLM tokens_per_block): "
            "refused unless the traces were collected with it (`collect --block-size`).",
        ),
    ] = None,
) -> None:
    """Calibrate a controller on probe traces: grids, Optuna study, bootstrap CIs, JSON + report."""
    preset = check_model(model)
    name = f"{model}-T{temp:g}"
    config = _calibration_config(
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
        margin=margin,
        signals=None if signals is None else tuple(s.strip() for s in signals.split(",") if s.strip()),
    )
    if free_running and confirm != "closed":
        bad_option("--free-running", "only applies with --confirm closed")
    if free_running and temp <= 0:
        bad_option("--free-running", "needs --temp > 0 (at T = 0 teacher forcing is exact)")
    traces = traces or Path("runs") / name / "probe"
    controller_option = "--controller" if controller_out is not None or out is None else "--out"
    if controller_out is None:  # with --out, everything the command writes goes under it
        controller_out = out / "controller.json" if out is not None else Path("controllers") / f"{name}.json"
    out = out or Path("runs") / name / "calibration"
    from rift_ada.collectors.trace_io import read_manifest

    try:
        manifest = read_manifest(traces)
    except ValueError as error:
        bad_option("--traces", str(error))
    from rift_ada.calibrate.pipeline import check_traces_match

    try:
        check_traces_match(manifest, preset.draft, preset.target_name, temp)
    except ValueError as error:
        bad_option("--traces", str(error))
    _check_block_size(block_size, manifest, traces)
    check_writable(controller_out, controller_option)
    check_writable(out / "report.md", "--out", root=out)
    if storage is not None:
        from rift_ada.calibrate.study import open_storage

        try:
            open_storage(storage)
        except Exception as error:  # any driver or URL problem: the storage named, before the study starts
            fail(f"--storage {storage}: {describe_error(error)}")
    from rift_ada.calibrate.export import export_controller
    from rift_ada.calibrate.pipeline import calibrate as run_calibration
    from rift_ada.collectors.trace_io import check_complete, manifest_hash, read_probe_traces

    _report_partial(check_complete(traces, allow_partial=allow_partial), traces)
    probe = read_probe_traces(traces)
    with progress_reporter() as progress:
        result = run_calibration(
            probe,
            out,
            dataclasses.replace(config, manifest_hash=manifest_hash(traces)),
            progress=progress.stage_callback(),
            log=progress.log,
        )
        if confirm == "closed":
            from rift_ada.experiments.confirm import confirm_closed_from_traces

            progress.update("closed-loop confirmation", 0, None)
            confirm_closed_from_traces(out, traces, model=model, margin=margin, free_running=free_running)
            result.calibration = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
            result.controller = json.loads(result.controller_path.read_text(encoding="utf-8"))
    export_controller(result.controller, controller_out)
    confirmation = result.calibration["confirmation"]
    if json_output:
        _print_json(
            {
                "controller": str(controller_out),
                "report": str(out / "report.md"),
                "splits": result.split_sizes,
                "confirmation": confirmation,
            }
        )
        return
    table = Table(title=f"Confirmation split ({confirmation['n_requests']} requests, paired bootstrap 95% CI)")
    shown = confirmation.get("closed_loop", confirmation)  # the closed-loop verdict when it was run
    names = [str(c["name"]) for c in shown["comparisons"]]
    for column in ("comparison", "baseline", "refresh reduction", "AL difference"):
        table.add_column(column, **_full_width(column, names, "comparison"))
    for comparison in shown["comparisons"]:
        reduction, difference = comparison["refresh_reduction"], comparison["al_difference"]
        table.add_row(
            _text(comparison["name"]),
            _text(comparison["baseline"]),
            "-"
            if not reduction
            else f"{100 * reduction['estimate']:.1f}% [{100 * (reduction['low'] or 0):.1f}, {100 * (reduction['high'] or 0):.1f}]",
            f"{difference['estimate']:+.3f} [{difference['low'] or 0:+.3f}, {difference['high'] or 0:+.3f}]",
        )
    console.print(_text(f"splits: {result.split_sizes}"))
    _print_table(table)
    console.print(_text(confirmation["verdict"]["text"]))
    console.print(
        Text.assemble("controller: ", (str(controller_out), "bold"), "   report: ", (str(out / "report.md"), "bold"))
    )


@app.command()
def show(
    path: Annotated[Path, typer.Argument(help="Controller JSON file.")],
    json_output: JsonOption = False,
) -> None:
    """Validate and pretty-print a controller as a rule tree."""
    from rift_ada.controller import Controller
    from rift_ada.policies.render import render_controller

    controller = Controller.load(path)
    if json_output:
        _print_json(controller.to_dict())
        return
    console.print(_plain_tree(render_controller(controller.to_dict())))


def _plain_tree(tree: Any) -> Any:
    """A rich Tree whose string labels are shown as-is (a ``[link=x]`` in a controller stays text)."""
    if isinstance(tree.label, str):
        tree.label = Text(tree.label)
    for child in tree.children:
        _plain_tree(child)
    return tree


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="Demo or calibration run directory.")] = Path("runs/demo"),
) -> None:
    """Print a run's report.md in the terminal."""
    from rich.markdown import Markdown

    path = run / "report.md" if run.is_dir() else run
    if not path.exists():
        fail(f"{path}: no report here (run `rift-ada demo` or `rift-ada calibrate` first)")
    Console(highlight=False).print(Markdown(path.read_text()))  # terminal width, even in a log


from rift_ada.cli import bench as _bench_cli  # noqa: E402
from rift_ada.cli import conformance as _conformance_cli  # noqa: E402
from rift_ada.cli import ray_launch as _ray_launch_cli  # noqa: E402
from rift_ada.cli import status as _status_cli  # noqa: E402
from rift_ada.cli import train as _train_cli  # noqa: E402  (registers train, train-eval)

_status_cli.register(app)
_bench_cli.register(app)
_ray_launch_cli.register(app)
_conformance_cli.register(app)
_train_cli.register(app)


class _Terminated(SystemExit):
    """SIGTERM (a preempted job): unwinds the stack, then the process ends without interpreter clean-up."""


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated(128 + signum)  # unwinds: a calibration worker marks its trials FAIL on the way out


def main() -> None:
    import signal
    import sys

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app()
    except _Terminated as stop:
        # Everything is committed or rolled back by now; skipping the interpreter's finalisation (a
        # garbage collection of torch's heap that took over 4 s on a busy machine) keeps the exit within
        # a scheduler's grace period.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(stop.code))


if __name__ == "__main__":
    main()
