"""`rift-ada targets` and `rift-ada collect`: from a dataset and a model pair to trace directories.

Each request is written as its own part once complete, so an interrupted collection resumes by
skipping committed requests; ``shard="i/N"`` takes a deterministic part of the requests so N
machines (or GPUs) can fill one directory together.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.budget import CachePolicy, make_policy
from rift_ada.collectors.datasets import Request, encode_prompt
from rift_ada.collectors.probe import probe_arms, probe_requests
from rift_ada.collectors.probe_traces import DEFAULT_ARM_AGES
from rift_ada.collectors.targets.files import read_targets, target_row
from rift_ada.collectors.targets.generate import ResponseRequest, generate_responses
from rift_ada.collectors.trace_io import TraceError, TraceWriter, base_manifest, shard_requests
from rift_ada.controller import Controller
from rift_ada.hooks import ControllerRefresh
from rift_ada.policy_spec import SPEC_FORMS, STAT, PolicySpec, parse
from rift_ada.speculative import BatchRequest, SpeculativeResult, speculative_generate_batch
from rift_ada.throughput import CLOSED_BATCH, PROBE_BATCH, TARGETS_BATCH

ProgressFn = Callable[[str, int], None]  # (request id, output tokens) after each request
TokensFn = Callable[[int, int], None]  # (output tokens, rounds or strides) as a stage commits them


@dataclass
class CollectSettings:
    """What a collection measures; the identity part of the manifest comes from here."""

    draft: str
    target: str
    temperature: float = 0.0
    seed: int = 0
    draft_length: int = 11
    decision_stride: int = 8
    budget: int = 512
    sw_ratio: float = 0.5
    obs_window: int = 64
    block_size: int | None = None
    arm_ages: tuple[int, ...] = DEFAULT_ARM_AGES
    dataset: str = "embedded"
    scorer: str = "snapkv"  # the prefill scorer of snapkv / rift-stat / rift-dyn (rift_ada.scorers.registry)

    def cache_policy(self, name: str = "rift-stat", refresh_interval: int | None = None) -> CachePolicy:
        fields: dict[str, Any] = {"sw_ratio": self.sw_ratio, "obs_window": self.obs_window}
        if name in ("rift-stat", "rift-dyn"):
            fields["block_size"] = self.block_size
        if name in ("snapkv", "rift-stat", "rift-dyn"):
            fields["scorer"] = self.scorer
        if refresh_interval is not None:
            fields["refresh_interval"] = refresh_interval
        return make_policy(name, budget=self.budget, **fields)

    def cache_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "sw_ratio": self.sw_ratio,
            "scorer": self.scorer,
            "block_size": self.block_size,
            "obs_window": self.obs_window,
        }

    def manifest(self, mode: str, n_requests: int, **extra: Any) -> dict[str, Any]:
        fields = {
            "mode": mode,
            "draft": self.draft,
            "target": self.target,
            "temperature": float(self.temperature),
            "seed": self.seed,
            "draft_length": self.draft_length,
            "decision_stride": self.decision_stride,
            "cache": self.cache_json(),
            "dataset": self.dataset,
            "n_requests": n_requests,
        }
        if mode == "probe":
            fields["arms"] = list(probe_arms(self.arm_ages))
        fields.update(extra)
        return base_manifest(**fields)


@dataclass
class ClosedPolicy:
    """A closed-loop policy: the draft cache policy and the controller that refreshes it."""

    label: str
    cache: CachePolicy
    controller: dict[str, Any]


NEVER = 1 << 30
BASELINE_CACHE_POLICIES = ("full", "swa", "streamingllm", "h2o", "snapkv")
# TriAttention as a decode-time baseline (paper Table 4): its scores choose the SnapKV-shaped
# selection (64-token window + top-k), rescored every this many committed tokens
TRIATTENTION_INTERVAL = 128


def resolve_closed_policy(spec: str, settings: CollectSettings) -> ClosedPolicy:
    """``full``/``swa``/``streamingllm``/``h2o``/``snapkv``/``stat`` (never refreshed), ``periodic:N`` /
    ``dyn:N`` (RIFT-dyn), ``triattention`` (decode-time TriAttention), or a controller JSON path (RIFT-ada).

    The spec is read by :func:`rift_ada.policy_spec.parse`; ``dyn:N`` is labelled ``periodic:N``.
    """
    from dataclasses import replace

    parsed = parse(spec)
    if parsed.kind == STAT:
        return ClosedPolicy(parsed.label, settings.cache_policy("rift-stat"), _periodic(NEVER, spec, settings))
    if parsed.kind == "triattention":
        tri = replace(settings, scorer="triattention")
        return ClosedPolicy(parsed.label, tri.cache_policy("snapkv"), _periodic(TRIATTENTION_INTERVAL, spec, tri))
    if parsed.kind in BASELINE_CACHE_POLICIES:
        return ClosedPolicy(parsed.label, settings.cache_policy(parsed.kind), _periodic(NEVER, spec, settings))
    if parsed.is_periodic:
        periodic = _periodic(parsed.interval, spec, settings)
        return ClosedPolicy(parsed.as_periodic().label, settings.cache_policy("rift-stat"), periodic)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"unknown policy {spec!r}: no such controller file; use one of {SPEC_FORMS}")
    loaded = Controller.load(path).to_dict()
    _check_controller_settings(loaded, settings, path)
    return ClosedPolicy(loaded.get("name", path.stem), settings.cache_policy("rift-stat"), loaded)


def _periodic(interval: int, name: str, run: CollectSettings) -> dict[str, Any]:
    """The run's controller refreshing every ``interval`` tokens (``NEVER``: a policy that never refreshes)."""
    return PolicySpec.periodic(interval).controller(
        name=name,
        draft=run.draft,
        target=run.target,
        temperature=run.temperature,
        cache=run.cache_json(),
        decision_stride=run.decision_stride,
    )


def _check_controller_settings(controller: dict[str, Any], settings: CollectSettings, path: Path) -> None:
    """Refuse a controller calibrated for another cache, stride or temperature than this run's."""
    wanted = settings.cache_json()
    problems = [
        f"cache.{key} is {controller['cache'][key]!r}, the run uses {wanted[key]!r}"
        for key in ("budget", "sw_ratio", "obs_window", "block_size", "scorer")
        if controller["cache"].get(key) != wanted[key]
    ]
    if controller["schedule"]["decision_stride"] != settings.decision_stride:
        problems.append(
            f"schedule.decision_stride is {controller['schedule']['decision_stride']}, "
            f"the run uses {settings.decision_stride}"
        )
    if float(controller["temperature"]) != float(settings.temperature):
        problems.append(f"temperature is {controller['temperature']}, the run uses {settings.temperature}")
    if problems:
        raise ValueError(f"{path}: controller does not match the run: " + "; ".join(problems))


def request_seed(seed: int, request_id: str) -> int:
    """A request's own seed: stable under resuming and sharding (unlike its position in a run)."""
    return (seed * 1_000_003 + zlib.crc32(request_id.encode())) % (2**31)


def _request_row(request: Request, isl: int, osl: int) -> dict[str, list[Any]]:
    """The one-row ``requests`` table of a request."""
    return {
        "request_id": [request.request_id],
        "dataset": [request.dataset],
        "category": [request.category],
        "tier": [request.tier],
        "isl": [isl],
        "osl": [osl],
    }


def generate_target_rows(
    target_model: Any,
    tokenizer: Any,
    requests: Sequence[Request],
    seeds: Sequence[int],
    *,
    target_name: str,
    temperature: float = 0.0,
    max_new_tokens: int = 512,
    min_new_tokens: int = 0,
    repetition_penalty: float = 1.0,
    on_request: ProgressFn | None = None,
    on_token: Callable[[int], None] | None = None,
    batch_size: int = TARGETS_BATCH,
) -> list[dict[str, Any]]:
    """Target rows for ``requests`` (request ``i`` sampled with ``seeds[i]``), ``batch_size`` decoding together."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(seeds) != len(requests):
        raise ValueError(f"seeds: need one per request ({len(requests)}), got {len(seeds)}")
    rows = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for first in range(0, len(requests), batch_size):
        chunk = list(zip(requests[first : first + batch_size], seeds[first : first + batch_size], strict=True))
        prompts = [encode_prompt(tokenizer, request.prompt_messages) for request, _ in chunk]
        asks = []
        for (request, request_seed), prompt_ids in zip(chunk, prompts, strict=True):
            limit = request.max_output_tokens or max_new_tokens
            cap = min(limit, max_new_tokens)
            asks.append(ResponseRequest(prompt_ids, cap, request_seed, min(min_new_tokens, limit)))
        responses = generate_responses(
            target_model,
            asks,
            temperature=temperature,
            eos_token_id=eos,
            repetition_penalty=repetition_penalty,
            on_token=on_token,
        )
        for (request, request_seed), prompt_ids, response in zip(chunk, prompts, responses, strict=True):
            text = tokenizer.decode(response, skip_special_tokens=True)
            rows.append(
                target_row(
                    request,
                    prompt_ids,
                    response,
                    text,
                    target_model=target_name,
                    temperature=temperature,
                    seed=request_seed,
                )
            )
            if on_request is not None:
                on_request(request.request_id, len(response))
    return rows


def _targets_by_id(targets: str | Path | Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rows = read_targets(targets) if isinstance(targets, (str, Path)) else list(targets)
    return {row["request_id"]: row for row in rows}


@dataclass
class CollectionSummary:
    """What a collection did (printed by the CLI, returned to callers)."""

    out_dir: str
    mode: str
    n_requests: int
    skipped: int
    collected: int
    output_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _todo(
    requests: Sequence[Request], targets: dict[str, dict[str, Any]], shard: str | None, writer: TraceWriter
) -> tuple[list[Request], int]:
    mine = shard_requests(list(requests), shard)
    missing = [request.request_id for request in mine if request.request_id not in targets]
    if missing:
        raise TraceError(f"no target response for request(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    done = writer.completed_request_ids()
    return [request for request in mine if request.request_id not in done], len(mine)


def collect_probe(
    draft_model: Any,
    requests: Sequence[Request],
    targets: str | Path | Sequence[dict[str, Any]],
    out_dir: str | Path,
    settings: CollectSettings,
    *,
    target_model: Any | None = None,
    shard: str | None = None,
    on_request: ProgressFn | None = None,
    extra_manifest: dict[str, Any] | None = None,
    batch_size: int = PROBE_BATCH,
    on_tokens: TokensFn | None = None,
) -> CollectionSummary:
    """Probe every request (teacher-forced on its target response) into ``out_dir``.

    ``batch_size`` requests are probed at a time, their arms' forwards stacked (`probe_requests`);
    each request's traces are written as soon as it ends. ``on_tokens(positions, strides)`` after
    every stride of the requests in flight."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_id = _targets_by_id(targets)
    max_positions = max(
        (len(by_id[r.request_id]["response_token_ids"]) for r in requests if r.request_id in by_id), default=0
    )
    manifest = settings.manifest("probe", len(requests), max_positions=max_positions, **(extra_manifest or {}))
    with TraceWriter(out_dir, manifest, shard=shard) as writer:  # its lease is released however this ends
        todo, n_mine = _todo(requests, by_id, shard, writer)
        arm_names = np.array(probe_arms(settings.arm_ages))
        texts = [
            (list(by_id[request.request_id]["prompt_token_ids"]), list(by_id[request.request_id]["response_token_ids"]))
            for request in todo
        ]
        results = probe_requests(
            draft_model,
            texts,
            policy=settings.cache_policy("rift-stat"),
            temperature=settings.temperature,
            arm_ages=settings.arm_ages,
            decision_stride=settings.decision_stride,
            target_model=target_model,
            batch_size=batch_size,
            on_tokens=on_tokens,
        )
        tokens = 0
        for index, result in results:
            request, (prompt_ids, response_ids) = todo[index], texts[index]
            n_out, n_strides, n_arms = len(response_ids), result.query_drift.shape[1], len(arm_names)
            writer.write_requests(
                {
                    "requests": _request_row(request, len(prompt_ids), n_out),
                    "positions": {
                        "request_id": [request.request_id] * (n_arms * n_out),
                        "arm": np.repeat(arm_names, n_out),
                        "position": np.tile(np.arange(n_out), n_arms),
                        "outcome": result.outcome.reshape(-1),
                        "entropy": result.entropy.reshape(-1),
                        **(
                            {"token_acceptance": result.token_acceptance.reshape(-1)}
                            if result.token_acceptance is not None
                            else {}
                        ),
                    },
                    "strides": {
                        "request_id": [request.request_id] * (n_arms * n_strides),
                        "arm": np.repeat(arm_names, n_strides),
                        "stride": np.tile(np.arange(n_strides), n_arms),
                        "query_drift": result.query_drift.reshape(-1),
                        "retained_mass": result.retained_mass.reshape(-1),
                    },
                }
            )
            tokens += n_out
            if on_request is not None:
                on_request(request.request_id, n_out)
        return CollectionSummary(str(out_dir), "probe", n_mine, n_mine - len(todo), len(todo), tokens)


def check_free_running(free_running: bool, temperature: float) -> None:
    """Free-running rejection sampling is a T > 0 mode (at T = 0 teacher forcing is exact)."""
    if free_running and float(temperature) <= 0:
        raise ValueError("free_running: needs temperature > 0 (at T = 0 teacher forcing is exact)")


def collect_closed(
    draft_model: Any,
    requests: Sequence[Request],
    targets: str | Path | Sequence[dict[str, Any]],
    out_dir: str | Path,
    settings: CollectSettings,
    policies: Sequence[str],
    *,
    target_model: Any | None = None,
    shard: str | None = None,
    on_request: ProgressFn | None = None,
    extra_manifest: dict[str, Any] | None = None,
    free_running: bool = False,
    batch_size: int = CLOSED_BATCH,
    on_tokens: TokensFn | None = None,
) -> CollectionSummary:
    """Run the real draft/verify loop for every policy.

    Up to ``batch_size`` (request, policy) runs share each batched draft/verify forward, a
    finished run's slot going to the next (`speculative_generate_batch`'s continuous
    batching); every run's result equals running it alone. A request's trace part is written
    as soon as all its policies have finished. ``on_tokens(tokens, rounds)`` after every batched
    round: the output tokens it committed over all runs, and the runs it advanced.

    Teacher-forced on the target responses by default. ``free_running`` (T > 0 ground truth)
    runs real rejection sampling instead, as many output tokens as the target response has;
    each policy then commits its own text, so only AL and refresh counts compare across policies.
    """
    check_free_running(free_running, settings.temperature)
    resolved = [resolve_closed_policy(spec, settings) for spec in policies]
    labels = [policy.label for policy in resolved]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policies: duplicate labels {labels}")
    extra = {
        "policies": labels,
        "controllers": {p.label: p.controller for p in resolved},
        "free_running": free_running,
        **(extra_manifest or {}),
    }
    manifest = settings.manifest("closed", len(requests), **extra)
    with TraceWriter(out_dir, manifest, shard=shard) as writer:  # its lease is released however this ends
        if writer.manifest.get("policies") != labels:
            raise TraceError(
                f"{out_dir}/manifest.json: policies {writer.manifest.get('policies')} differ from {labels}; "
                "use another output directory"
            )
        by_id = _targets_by_id(targets)
        todo, n_mine = _todo(requests, by_id, shard, writer)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        runs = [(request, policy) for request in todo for policy in resolved]
        hooks = [ControllerRefresh(Controller.from_dict(policy.controller), record_strides=True) for _, policy in runs]
        batch = []
        for (request, policy), hook in zip(runs, hooks, strict=True):
            response_ids = list(by_id[request.request_id]["response_token_ids"])
            batch.append(
                BatchRequest(
                    list(by_id[request.request_id]["prompt_token_ids"]),
                    policy.cache,
                    max_new_tokens=len(response_ids),
                    seed=request_seed(settings.seed, request.request_id),
                    refresh_hook=hook,
                    forced_tokens=None if free_running else response_ids,
                )
            )
        finished: dict[str, list[tuple[ClosedPolicy, SpeculativeResult, ControllerRefresh] | None]] = {}
        tokens = 0

        def write_when_complete(index: int, result: SpeculativeResult) -> None:
            """A request's trace part is written once all its policies have finished (in policy order)."""
            nonlocal tokens
            request, policy = runs[index]
            done = finished.setdefault(request.request_id, [None] * len(resolved))
            done[index % len(resolved)] = (policy, result, hooks[index])
            if all(entry is not None for entry in done):
                del finished[request.request_id]
                n_out = _write_closed_request(writer, request, by_id[request.request_id], done)  # type: ignore[arg-type]
                tokens += n_out * len(resolved)
                if on_request is not None:
                    on_request(request.request_id, n_out)

        # Continuous batching: a (request, policy) run that finishes gives its slot to the next one.
        speculative_generate_batch(
            draft_model,
            batch,
            target_model=target_model,
            draft_length=settings.draft_length,
            temperature=settings.temperature,
            max_batch=batch_size,
            on_finish=write_when_complete,
            on_progress=on_tokens,
        )
        return CollectionSummary(
            str(out_dir), "closed", n_mine, n_mine - len(todo), len(todo), tokens, {"policies": labels}
        )


_STRIDE_COLUMNS = (
    "request_id",
    "policy",
    "stride",
    "position",
    "age",
    "acceptance",
    "entropy",
    "query_drift",
    "acceptance_drop",
    "entropy_rise",
    "refreshed",
    "retained_mass",
)
_ROUND_COLUMNS = ("request_id", "policy", "round", "position", "accepted", "al", "entropy_mean", "age", "refreshed")


def _write_closed_request(
    writer: TraceWriter,
    request: Request,
    target: dict[str, Any],
    runs: list[tuple[ClosedPolicy, SpeculativeResult, ControllerRefresh]],
) -> int:
    """Write one request's rounds and strides under every policy; returns its output length."""
    rounds: dict[str, list[Any]] = {key: [] for key in _ROUND_COLUMNS}
    strides: list[dict[str, Any]] = []
    for policy, result, hook in runs:
        for record in result.rounds:
            rounds["request_id"].append(request.request_id)
            rounds["policy"].append(policy.label)
            rounds["round"].append(record.index)
            rounds["position"].append(record.position)
            rounds["accepted"].append(record.accepted)
            rounds["al"].append(record.al)
            rounds["entropy_mean"].append(float(np.mean(record.committed_entropies)))
            rounds["age"].append(record.age)
            rounds["refreshed"].append(record.refreshed)
        for stride_row in hook.strides:
            strides.append({"request_id": request.request_id, "policy": policy.label, **stride_row})
    stride_table = {
        column: [(np.nan if r.get(column) is None else r.get(column)) for r in strides] for column in _STRIDE_COLUMNS
    }
    n_out = len(target["response_token_ids"])
    writer.write_requests(
        {
            "requests": _request_row(request, len(target["prompt_token_ids"]), n_out),
            "rounds": rounds,
            "strides": stride_table,
        }
    )
    return n_out


def closed_results(out_dir: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """Per policy, per-request totals of a closed run: request_id, committed, rounds, refreshes, al."""
    from rift_ada.collectors.trace_io import read_tables

    tables = read_tables(out_dir, kinds=["rounds"])
    table = tables["rounds"]
    columns = {name: np.asarray(table.column(name).to_pylist()) for name in ("request_id", "policy", "al", "refreshed")}
    results: dict[str, dict[str, np.ndarray]] = {}
    for label in sorted(set(columns["policy"].tolist())):
        mask = columns["policy"] == label
        ids = columns["request_id"][mask]
        unique = np.array(sorted(set(ids.tolist())))
        committed = np.array([columns["al"][mask][ids == rid].sum() for rid in unique])
        n_rounds = np.array([(ids == rid).sum() for rid in unique])
        refreshes = np.array([columns["refreshed"][mask][ids == rid].sum() for rid in unique])
        results[label] = {
            "request_id": unique,
            "committed": committed,
            "rounds": n_rounds,
            "refreshes": refreshes,
            "al": committed / np.maximum(n_rounds, 1),
        }
    return results
