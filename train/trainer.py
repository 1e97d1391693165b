"""The training loop: masked KD of the draft from the target on target rollouts (seeded, resumable).

Each sample: a dense no-grad pass of the frozen draft gives attention scores (and, in
self-speculation, the teacher's logits: the frozen draft *is* the target); an external target gives
its logits in its own pass; the student then runs under the sample's compression mask and the
CE + KD loss over the response positions is back-propagated. Gradients of ``batch_size`` samples
are accumulated per optimizer step.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rift_ada.atomic import (
    atomic_publish_dir,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    json_safe,
    reporting_disk_full,
)
from rift_ada.collectors.lease import run_lock
from rift_ada.collectors.pipeline import LoadedPair, ensure_targets, load_pair
from rift_ada.collectors.targets.files import read_targets
from rift_ada.collectors.trace_io import package_versions
from rift_ada.models import TRAINED_DRAFT_FILE
from rift_ada.train.attention import capture_scores, install_training_attention, masked, restore_attention
from rift_ada.train.config import TrainConfig
from rift_ada.train.data import Sample, load_training_requests, make_samples, sample_order, split_requests
from rift_ada.train.losses import distillation_loss
from rift_ada.train.masks import sample_mask, sample_p, windowed_scores

log = logging.getLogger("rift_ada.train")
StepFn = Callable[[int, int, dict[str, float]], None]  # (step done, total steps, logged values)


@dataclass
class TrainingModels:
    """The student (peft-wrapped under LoRA), its frozen dense self, and an external teacher if any."""

    pair: LoadedPair
    student: Any
    frozen_copy: Any | None  # full fine-tuning: a frozen copy of the initial draft
    teacher: Any | None  # external target; None in self-speculation (the frozen draft teaches)
    lora: bool

    @contextlib.contextmanager
    def frozen_draft(self) -> Iterator[Any]:
        """The initial draft, dense: the student with its adapter off (LoRA) or the frozen copy."""
        if self.lora:
            with self.student.disable_adapter():
                yield self.student
        else:
            yield self.frozen_copy


def build_models(config: TrainConfig, pair: LoadedPair | None = None) -> TrainingModels:
    """Load the pair, wrap the draft for LoRA (or unfreeze it) and route its attention through masks."""
    pair = pair or load_pair(config.model, device=config.device, dtype=config.dtype)
    draft = pair.draft
    frozen_copy = None
    if config.lora:
        from peft import LoraConfig, get_peft_model

        targets = config.lora_targets if config.lora_targets == "all-linear" else config.lora_targets.split(",")

        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha if config.lora_alpha is not None else 2 * config.lora_rank,
            lora_dropout=0.0,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        student = get_peft_model(draft, lora)
    else:
        frozen_copy = copy.deepcopy(draft).eval().requires_grad_(False)
        install_training_attention(frozen_copy)
        student = draft.requires_grad_(True)
    install_training_attention(student)
    if pair.target is not None:
        pair.target.eval().requires_grad_(False)
    return TrainingModels(pair, student, frozen_copy, pair.target, config.lora)


def _response_logits(model: Any, ids: torch.Tensor, n_positions: int) -> torch.Tensor:
    """Logits (n_positions, V) of the positions that predict the last ``n_positions`` tokens."""
    return model(input_ids=ids, use_cache=False, logits_to_keep=n_positions + 1).logits[0, :-1]


@torch.no_grad()
def dense_pass(models: TrainingModels, sample: Sample, want_scores: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(teacher logits over the response, dense attention scores (L, L) of the frozen draft or None)."""
    device = next(models.student.parameters()).device
    ids = torch.tensor([sample.input_ids], device=device)
    n_response = sample.response_length
    scores = draft_logits = None
    if want_scores or models.teacher is None:
        with models.frozen_draft() as frozen:
            capture = capture_scores() if want_scores else contextlib.nullcontext({})
            with capture as buffer:
                draft_logits = _response_logits(frozen, ids, n_response)
            if want_scores:
                scores = (buffer["sum"][0] / buffer["layers"]).float()
    if models.teacher is None:
        return draft_logits, scores
    return _response_logits(models.teacher, ids.to(next(models.teacher.parameters()).device), n_response), scores


def sample_generator(seed: int, index: int) -> torch.Generator:
    """The generator of the ``index``-th draw (its p and random mask): resumable, order-independent."""
    return torch.Generator().manual_seed(seed * 1_000_003 + index + 1)


def training_step_loss(
    models: TrainingModels, sample: Sample, config: TrainConfig, generator: torch.Generator
) -> tuple[dict[str, torch.Tensor], float]:
    """Loss terms of one sample under its drawn mask (graph attached), and the p it drew."""
    p = sample_p(generator, config.p_values, config.p_probs) if config.mask != "none" else 0.0
    teacher_logits, scores = dense_pass(models, sample, want_scores=config.mask == "attention")
    if scores is not None:
        scores = windowed_scores(scores, config.score_window)
    length = len(sample.input_ids)
    mask = sample_mask(config.mask, scores, length, p, config.rho, sample.prompt_length - 1, generator)
    device = next(models.student.parameters()).device
    ids = torch.tensor([sample.input_ids], device=device)
    with masked(None if mask is None else mask[None].to(device)):
        student_logits = _response_logits(models.student, ids, sample.response_length)
    labels = ids[0, sample.prompt_length :]
    return distillation_loss(student_logits, teacher_logits.to(student_logits.device), labels, config.loss), p


def _lr_factor(config: TrainConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _trainable(student: Any) -> dict[str, torch.nn.Parameter]:
    return {name: param for name, param in student.named_parameters() if param.requires_grad}


def _save_checkpoint(path: Path, step: int, config: TrainConfig, student: Any, optimizer: Any, scheduler: Any) -> None:
    state = {
        "step": step,
        "identity": json.loads(json.dumps(config.identity())),
        "trainable": {name: param.detach().cpu() for name, param in _trainable(student).items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    atomic_write(path, lambda temporary: torch.save(state, temporary))


def _load_checkpoint(path: Path, config: TrainConfig, student: Any, optimizer: Any, scheduler: Any) -> int:
    state = torch.load(path, map_location="cpu", weights_only=False)
    wanted = json.loads(json.dumps(config.identity()))  # tuples as lists, as stored
    changed = sorted(key for key in wanted if state["identity"].get(key) != wanted[key])
    if changed:
        fields = ", ".join(changed)
        raise ValueError(f"{path}: checkpoint of a different run (fields differ: {fields}); use another --out")
    params = _trainable(student)
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value.to(params[name].device))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def save_trained_draft(models: TrainingModels, out_dir: Path, training: dict[str, Any]) -> Path:
    """Merge LoRA into the weights and save a plain transformers model any command loads as ``--model DIR``."""
    student = models.student.merge_and_unload() if models.lora else models.student
    restore_attention(student)
    student.eval()
    _remove_stale_staging(out_dir)
    staging = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        _save_model_into(models, student, staging, training)
        atomic_publish_dir(staging, out_dir)  # the old model stays in place until the new one replaces it
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)  # a full disk: free what the half-saved model took
        raise
    return out_dir


def _save_model_into(models: TrainingModels, student: Any, staging: Path, training: dict[str, Any]) -> None:
    with reporting_disk_full(staging):
        student.save_pretrained(staging)
        models.pair.tokenizer.save_pretrained(staging)
    preset = models.pair.preset
    target = preset.target_name
    if Path(target).exists():  # a local base model: keep it findable from anywhere
        target = str(Path(target).resolve())
    meta = {
        "format": "rift-ada.draft",
        "version": 1,
        "base_draft": preset.draft,
        "target": target,
        "budget": preset.budget,
        "temperature": preset.temperature,
        "architecture": preset.architecture,
        "training": training,
    }
    atomic_write_json(staging / TRAINED_DRAFT_FILE, json_safe(meta))


def _remove_stale_staging(out_dir: Path) -> None:
    """Folders a killed run left while saving (``.model.tmp-<pid>``, ``.model.old-<pid>``); one trainer per run."""
    import shutil

    for leftover in out_dir.parent.glob(f".{out_dir.name}.*"):
        if leftover.is_dir() and (".tmp" in leftover.name or ".old-" in leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)


def _resume_log(log_path: Path, step: int) -> tuple[float | None, float | None]:
    """Keep the log's records of steps ``1..step`` (a killed run may have logged steps after its
    last checkpoint, or half a line on a full disk); returns the losses of steps 1 and ``step``."""
    if not log_path.exists():
        return None, None
    kept: dict[int, str] = {}
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and 1 <= record["step"] <= step:
            kept[record["step"]] = line
    atomic_write_text(log_path, "".join(kept[n] + "\n" for n in sorted(kept)))
    loss = {n: json.loads(kept[n])["loss"] for n in (1, step) if n in kept}
    return loss.get(1), loss.get(step)


@dataclass
class TrainResult:
    out_dir: Path
    model_dir: Path
    steps: int
    first_loss: float | None
    last_loss: float | None
    seconds: float


def prepare_samples(config: TrainConfig, pair: LoadedPair, out_dir: Path, targets: Path | None) -> dict[str, Any]:
    """Split the dataset, generate (or read) target rollouts for the training part, build samples."""
    requests = load_training_requests(
        config.dataset, pair.tokenizer, n_requests=config.n_requests, isl_buckets=config.isl_buckets
    )
    train_requests, eval_requests = split_requests(requests, config.eval_fraction, config.seed)
    log.info("%d requests: %d for training, %d held out", len(requests), len(train_requests), len(eval_requests))
    if targets is not None and targets.exists():  # given rollouts (e.g. imported) are read, never overwritten
        covered = {row["request_id"] for row in read_targets(targets)}
        missing = [request.request_id for request in train_requests if request.request_id not in covered]
        if missing:
            raise ValueError(f"{targets}: no rollout for training request(s) {missing[:5]} (dataset or seed differ?)")
    rows = ensure_targets(
        pair,
        train_requests,
        targets or out_dir / "rollouts.parquet",
        temperature=config.rollout_temperature,
        seed=config.seed,
        max_new_tokens=config.rollout_max_new_tokens,
        min_new_tokens=config.rollout_min_new_tokens,
        repetition_penalty=config.repetition_penalty,
        on_request=lambda request_id, n_tokens: log.info("rollout %s: %d tokens", request_id, n_tokens),
    )
    return {
        "samples": make_samples(rows, config.max_length),
        "train_ids": [r.request_id for r in train_requests],
        "eval_ids": [r.request_id for r in eval_requests],
    }


def train(
    config: TrainConfig,
    out_dir: str | Path,
    *,
    targets: str | Path | None = None,
    pair: LoadedPair | None = None,
    on_step: StepFn | None = None,
) -> TrainResult:
    """Run (or resume) compressibility training into ``out_dir``; the trained draft lands in ``out_dir/model``."""
    out_dir = Path(out_dir)
    with run_lock(out_dir, "train", what=f"rift-ada train on {out_dir}"):  # one trainer per run directory
        return _train(config, out_dir, targets=targets, pair=pair, on_step=on_step)


def _train(
    config: TrainConfig, out_dir: Path, *, targets: str | Path | None, pair: LoadedPair | None, on_step: StepFn | None
) -> TrainResult:
    torch.manual_seed(config.seed)
    pair = pair or load_pair(config.model, device=config.device, dtype=config.dtype)
    data = prepare_samples(config, pair, out_dir, Path(targets) if targets else None)
    models = build_models(config, pair)
    samples: list[Sample] = data["samples"]
    trainable = list(_trainable(models.student).values())
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(config))
    checkpoint = out_dir / "checkpoint.pt"
    start = _load_checkpoint(checkpoint, config, models.student, optimizer, scheduler) if checkpoint.exists() else 0
    if start:
        log.info("resuming from %s at step %d", checkpoint, start)
    models.student.train()
    log_path = out_dir / "train-log.jsonl"
    began = time.monotonic()
    first, last = _resume_log(log_path, start) if start else (None, None)
    if not start:
        log_path.unlink(missing_ok=True)  # a run killed before its first checkpoint starts its log again
    for step in range(start, config.steps):
        optimizer.zero_grad(set_to_none=True)
        totals = {"total": 0.0, "ce": 0.0, "kd": 0.0}
        drawn = []
        for micro in range(config.batch_size):
            index = step * config.batch_size + micro
            sample = samples[sample_order(len(samples), config.seed, index)]
            losses, p = training_step_loss(models, sample, config, sample_generator(config.seed, index))
            (losses["total"] / config.batch_size).backward()
            for key in totals:
                totals[key] += float(losses[key].detach()) / config.batch_size
            drawn.append(p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm))
        optimizer.step()
        scheduler.step()
        record = {
            "step": step + 1,
            "loss": totals["total"],
            "ce": totals["ce"],
            "kd": totals["kd"],
            "lr": scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            "p": drawn,
            "seconds": round(time.monotonic() - began, 2),
        }
        first = record["loss"] if first is None else first
        last = record["loss"]
        with reporting_disk_full(log_path), log_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if (step + 1) % config.log_every == 0:
            log.info(
                "step %d/%d loss %.4f (ce %.4f kd %.4f) lr %.2e",
                *(step + 1, config.steps, last, totals["ce"], totals["kd"], record["lr"]),
            )
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            _save_checkpoint(checkpoint, step + 1, config, models.student, optimizer, scheduler)
        if on_step is not None:
            on_step(step + 1, config.steps, record)
    seconds = time.monotonic() - began
    manifest = {
        "format": "rift-ada.training",
        "version": 1,
        "config": config.to_dict(),
        "preset": models.pair.preset.to_dict(),
        "split": {"seed": config.seed, "train": data["train_ids"], "eval": data["eval_ids"]},
        "n_samples": len(samples),
        "mean_sequence_tokens": sum(len(s.input_ids) for s in samples) / len(samples),
        "mean_response_tokens": sum(s.response_length for s in samples) / len(samples),
        "steps": config.steps,
        "resumed_at": start,
        "first_loss": first,
        "last_loss": last,
        "seconds_this_session": round(seconds, 1),
        "versions": {**package_versions(), "peft": _peft_version()},
        "command_line": list(sys.argv),
    }
    atomic_write_json(out_dir / "train.json", json_safe(manifest))
    provenance = {"run": str(out_dir.resolve()), "steps": config.steps, "mask": config.mask}
    model_dir = save_trained_draft(models, out_dir / "model", provenance)
    return TrainResult(out_dir, model_dir, config.steps, first, last, seconds)


def _peft_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("peft")
    except metadata.PackageNotFoundError:
        return None
