"""`rift-ada train` (compressibility training) and `rift-ada train-eval` (before/after AL table)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from rift_ada.cli._common import check_writable, console, progress_reporter
from rift_ada.cli._options import DEFAULT_SCORER, ScorerOption


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError as error:
        raise ValueError(f"{name}: expected comma-separated numbers, got {text!r}") from error


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as error:
        raise ValueError(f"{name}: expected comma-separated integers, got {text!r}") from error


def train(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Preset name, local directory or Hub id.")
    ] = "smollm2-135m",
    out: Annotated[Path, typer.Option(help="Run directory (checkpoint, log, train.json, model/).")] = Path(
        "runs/train"
    ),
    dataset: Annotated[str, typer.Option(help="Dataset spec (see `rift-ada datasets`).")] = "embedded",
    n_requests: Annotated[int | None, typer.Option(help="Embedded dataset: prompts to build.")] = None,
    isl_buckets: Annotated[str | None, typer.Option(help="Embedded dataset: ISL buckets, e.g. 512,1024.")] = None,
    eval_fraction: Annotated[float, typer.Option(help="Share of requests held out for train-eval.")] = 0.25,
    targets_file: Annotated[
        Path | None,
        typer.Option("--targets", help="Rollouts Parquet (`rift-ada targets [--import]`); generated if absent."),
    ] = None,
    rollout_temp: Annotated[float, typer.Option(help="Temperature of generated target rollouts.")] = 1.0,
    rollout_tokens: Annotated[int, typer.Option(help="Cap on rollout tokens per request.")] = 256,
    max_length: Annotated[int, typer.Option(help="Tokens per training sequence (response cut first).")] = 2048,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 100,
    batch_size: Annotated[int, typer.Option(help="Samples per optimizer step (accumulated).")] = 8,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 1e-4,
    warmup: Annotated[int, typer.Option(help="Linear warm-up steps.")] = 0,
    schedule: Annotated[str, typer.Option(help="cosine or constant.")] = "cosine",
    full: Annotated[bool, typer.Option("--full", help="Full fine-tuning instead of LoRA.")] = False,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    lora_alpha: Annotated[float | None, typer.Option(help="LoRA alpha (default 2 x rank).")] = None,
    lora_targets: Annotated[str, typer.Option(help="all-linear or comma-separated module names.")] = "all-linear",
    mask: Annotated[str, typer.Option(help="attention (paper), random, window or none (controls).")] = "attention",
    rho: Annotated[float, typer.Option(help="Training sliding-window share of the kept keys.")] = 0.25,
    p_values: Annotated[str, typer.Option(help="Masked fractions p.")] = "0.1,0.3,0.5,0.7,0.9",
    p_probs: Annotated[str, typer.Option(help="Their probabilities.")] = "0.05,0.10,0.20,0.25,0.40",
    score_window: Annotated[int, typer.Option(help="Queries whose dense attention scores a key (1 = own row).")] = 1,
    ce_weight: Annotated[float, typer.Option(help="lambda_CE.")] = 0.25,
    kd_weight: Annotated[float, typer.Option(help="lambda_KD.")] = 0.75,
    kd_temp: Annotated[float, typer.Option(help="KD temperature T_KD.")] = 2.0,
    skew_alpha: Annotated[float | None, typer.Option(help="Skewed KL: teacher weight alpha in (0, 1].")] = None,
    seed: Annotated[int, typer.Option(help="Seed of split, rollouts, sample order, p and random masks.")] = 0,
    checkpoint_every: Annotated[int, typer.Option(help="Save a resumable checkpoint every N steps.")] = 25,
    device: Annotated[str, typer.Option(help="torch device (cuda for real presets).")] = "cpu",
    dtype: Annotated[str | None, typer.Option(help="float32 (CPU default) or bfloat16 (GPU default).")] = None,
) -> None:
    """Distil the draft from the target under compression-driven attention masks (paper §5)."""
    from rift_ada.cli._errors import fail, note_output
    from rift_ada.train.config import TrainConfig
    from rift_ada.train.losses import LossWeights
    from rift_ada.train.trainer import train as run_training

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = TrainConfig(
            model=model,
            dataset=dataset,
            n_requests=n_requests,
            isl_buckets=_ints(isl_buckets, "--isl-buckets") if isl_buckets else None,
            eval_fraction=eval_fraction,
            rollout_temperature=rollout_temp,
            rollout_max_new_tokens=rollout_tokens,
            max_length=max_length,
            seed=seed,
            steps=steps,
            batch_size=batch_size,
            learning_rate=lr,
            warmup_steps=warmup,
            schedule=schedule,
            lora=not full,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            lora_targets=lora_targets,
            mask=mask,
            rho=rho,
            p_values=_floats(p_values, "--p-values"),
            p_probs=_floats(p_probs, "--p-probs"),
            score_window=score_window,
            loss=LossWeights(ce=ce_weight, kd=kd_weight, temperature=kd_temp, skew_alpha=skew_alpha),
            device=device,
            dtype=dtype,
            checkpoint_every=checkpoint_every,
        )
    except ValueError as error:  # an option out of range: a usage error, before any model loads
        fail(error, code=2)
    check_writable(out / "train.json", "--out", root=out)
    if targets_file is not None:
        note_output(targets_file, "--targets")  # generated there when absent
    try:
        with progress_reporter() as progress:

            def on_step(done: int, total: int, record: dict) -> None:
                progress.update("train", done, total, unit="steps")  # the loss goes to the log (rift_ada.train)

            result = run_training(config, out, targets=targets_file, on_step=on_step)
    except (ValueError, OSError, ImportError) as error:
        fail(error)
    console.print(
        Text.assemble(
            f"trained {result.steps} steps (loss {result.first_loss} -> {result.last_loss}); draft saved to ",
            (str(result.model_dir), "bold"),
            f" (use it as --model {result.model_dir})",
        )
    )


def train_eval(
    run: Annotated[list[Path], typer.Option(help="Training run directory (repeat: masked, no-mask, ...).")],
    out: Annotated[Path, typer.Option(help="Evaluation directory (eval.json, eval.md, closed runs).")] = Path(
        "runs/train-eval"
    ),
    label: Annotated[list[str] | None, typer.Option(help="A label per --run (default: directory names).")] = None,
    reference: Annotated[
        str | None, typer.Option(help="Also compare every run with this label (e.g. no-mask).")
    ] = None,
    budgets: Annotated[str, typer.Option(help="Draft KV budgets, comma separated.")] = "128,256,512",
    dyn_interval: Annotated[int, typer.Option(help="RIFT-dyn refresh interval Δ (tokens).")] = 64,
    temp: Annotated[float, typer.Option("--temp", "-t", help="Temperature (0: teacher-forced greedy).")] = 0.0,
    max_new_tokens: Annotated[int, typer.Option(help="Target response tokens per held-out request.")] = 256,
    sw_ratio: Annotated[float, typer.Option(help="Inference sliding-window share rho.")] = 0.5,
    scorer: ScorerOption = DEFAULT_SCORER,
    seed: Annotated[int, typer.Option(help="Seed of sampling and bootstrap.")] = 0,
    device: Annotated[str, typer.Option(help="torch device.")] = "cpu",
) -> None:
    """AL before/after training (full KV, RIFT-stat, RIFT-dyn per budget) with paired-bootstrap CIs."""
    from rift_ada.cli._errors import fail
    from rift_ada.train.evaluate import EvalSettings, evaluate_runs

    try:
        settings = EvalSettings(
            budgets=_ints(budgets, "--budgets"),
            dyn_interval=dyn_interval,
            temperature=temp,
            seed=seed,
            max_new_tokens=max_new_tokens,
            sw_ratio=sw_ratio,
            scorer=scorer,
        )
    except ValueError as error:  # an option out of range: a usage error, before any model loads
        fail(error, code=2)
    check_writable(out / "eval.json", "--out", root=out)
    try:
        with progress_reporter() as progress:
            result = evaluate_runs(
                run,
                out,
                settings,
                labels=label,
                reference=reference,
                device=device,
                on_request=progress.request_callback("closed loop", None),
            )
    except (ValueError, OSError) as error:
        fail(error)
    console.print(Text(result["markdown"]))
    console.print(Text.assemble("results: ", (str(out / "eval.json"), "bold")))


def register(app: typer.Typer) -> None:
    """Add `train` and `train-eval` to the `rift-ada` app."""
    app.command("train")(train)
    app.command("train-eval")(train_eval)
