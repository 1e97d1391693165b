"""File loaders (SPEED-Bench, plain JSONL prompts), the dataset spec resolver and ``save_jsonl``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from rift_ada.atomic import atomic_write_text
from rift_ada.collectors.datasets.embedded import EMBEDDED_DEFAULT_REQUESTS, EMBEDDED_SMALL, build_embedded_dataset
from rift_ada.collectors.datasets.request import ROLES, DatasetError, Request
from rift_ada.collectors.datasets.tokenise import tokenize_requests


def _tier_from_value(value: Any) -> str | None:
    """'low' / 'high' from a tier-like value ('low', 'high_entropy', 'mixed' -> 'high'), else None."""
    if value is None or isinstance(value, bool):
        return None
    tokens = [token for token in re.split(r"[^a-z0-9]+", str(value).lower()) if token]
    for token in tokens:
        if token.startswith("low"):
            return "low"
        if token.startswith(("high", "mixed", "medium", "mid")):
            return "high"
    return None


def _tier_from_path(path: Path) -> str | None:
    return _tier_from_value(path.name)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DatasetError(f"{path}: file not found")
    if not path.is_file():
        raise DatasetError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: file is empty")


def read_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, record) pairs from a JSONL or Parquet file; errors name the file and line (or row)."""
    _check_file(path)
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if ".parquet" in suffixes or ".pq" in suffixes:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises several types for corrupt files
            raise DatasetError(f"{path}: cannot read Parquet file ({error})") from error
        records = [(f"{path}: row {index + 1}", row) for index, row in enumerate(rows)]
    else:
        records = []
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetError(f"{path}:{line_number}: malformed JSON ({error.msg})") from error
                if not isinstance(record, dict):
                    kind = type(record).__name__
                    raise DatasetError(f"{path}:{line_number}: expected a JSON object, got {kind}")
                records.append((f"{path}:{line_number}", record))
    if not records:
        raise DatasetError(f"{path}: file has no records")
    return records


def _require(record: dict[str, Any], name: str, where: str) -> Any:
    value = record.get(name)
    if value is None or (isinstance(value, str | list) and len(value) == 0):
        raise DatasetError(f"{where}: missing required field {name!r}")
    return value


def _check_messages(messages: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DatasetError(f"{where}: messages[{index}] needs 'role' and 'content'")
        if message["role"] not in ROLES or not isinstance(message["content"], str):
            raise DatasetError(
                f"{where}: messages[{index}] has role {message['role']!r} (expected one of "
                f"{sorted(ROLES)}) or non-string content"
            )
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def _check_unique(requests: Sequence[Request], path: Path) -> None:
    seen: set[str] = set()
    for request in requests:
        if request.request_id in seen:
            raise DatasetError(f"{path}: duplicate request id {request.request_id!r}")
        seen.add(request.request_id)


def _optional_int(record: dict[str, Any], name: str, where: str) -> int | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        raise DatasetError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
    return int(value)


def load_speed_bench(
    path: str | Path,
    *,
    turns: Literal["first", "concat"] = "first",
    tier: str | None = None,
    dataset: str = "speed-bench",
    max_output_tokens: int | None = None,
) -> list[Request]:
    """Load SPEED-Bench prompts from Parquet or JSONL (fields ``question_id``, ``category``, ``turns``).

    ``turns="first"`` uses the first user turn; ``"concat"`` joins all turns into one user message.
    The tier comes from ``tier`` if given, else a ``tier`` / ``entropy`` / ``entropy_tier`` / ``split``
    field, else the category, else the file name (containing "low" or "high"), else "low".
    """
    path = Path(path)
    forced = _tier_from_value(tier) if tier is not None else None
    if tier is not None and forced is None:
        raise DatasetError(f"{path}: tier must be 'low' or 'high', got {tier!r}")
    file_tier = _tier_from_path(path)
    requests = []
    for where, record in read_records(path):
        question_id = _require(record, "question_id", where)
        category = _require(record, "category", where)
        raw_turns = _require(record, "turns", where)
        if isinstance(raw_turns, str):
            raw_turns = [raw_turns]
        if not isinstance(raw_turns, list) or not all(isinstance(turn, str) for turn in raw_turns):
            raise DatasetError(f"{where}: field 'turns' must be a list of strings")
        content = raw_turns[0] if turns == "first" else "\n\n".join(raw_turns)
        row_tier = forced
        for name in ("tier", "entropy", "entropy_tier", "split"):
            if row_tier is None:
                row_tier = _tier_from_value(record.get(name))
        row_tier = row_tier or _tier_from_value(category) or file_tier or "low"
        requests.append(
            Request(
                request_id=str(question_id),
                dataset=dataset,
                category=str(category),
                tier=row_tier,
                prompt_messages=[{"role": "user", "content": content}],
                max_output_tokens=_optional_int(record, "max_output_tokens", where) or max_output_tokens,
                reference_response=None,
                metadata={"turns": len(raw_turns)},
            )
        )
    _check_unique(requests, path)
    return requests


def load_jsonl_prompts(
    path: str | Path, *, dataset: str | None = None, max_output_tokens: int | None = None
) -> list[Request]:
    """Load plain prompts: one JSON object per line with ``prompt`` or ``messages`` (+ optional fields).

    Optional fields: ``id``, ``category`` (default "default"), ``tier`` (default from the file name,
    else "low"), ``dataset``, ``max_output_tokens``, ``reference_response``.
    """
    path = Path(path)
    file_tier = _tier_from_path(path)
    default_dataset = dataset or path.stem.split(".")[0]
    requests = []
    for ordinal, (where, record) in enumerate(read_records(path)):
        if record.get("messages") is not None:
            messages = _check_messages(record["messages"], where)
        elif record.get("prompt") is not None:
            if not isinstance(record["prompt"], str) or not record["prompt"]:
                raise DatasetError(f"{where}: field 'prompt' must be a non-empty string")
            messages = [{"role": "user", "content": record["prompt"]}]
        else:
            raise DatasetError(f"{where}: missing required field 'prompt' (or 'messages')")
        row_tier = file_tier or "low"
        if record.get("tier") is not None:
            row_tier = _tier_from_value(record["tier"])
            if row_tier is None:
                raise DatasetError(f"{where}: field 'tier' must be 'low' or 'high', got {record['tier']!r}")
        reference = record.get("reference_response")
        request_id = str(record["id"]) if record.get("id") is not None else f"{default_dataset}-{ordinal:05d}"
        requests.append(
            Request(
                request_id=request_id,
                dataset=str(record.get("dataset") or default_dataset),
                category=str(record.get("category") or "default"),
                tier=row_tier,
                prompt_messages=messages,
                max_output_tokens=_optional_int(record, "max_output_tokens", where) or max_output_tokens,
                reference_response=str(reference) if reference is not None else None,
            )
        )
    _check_unique(requests, path)
    return requests


def _looks_like_speed_bench(path: Path) -> bool:
    """True when the file's first record has a ``turns`` field (SPEED-Bench layout)."""
    _check_file(path)
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if ".parquet" in suffixes or ".pq" in suffixes:
        import pyarrow.parquet as pq

        try:
            return "turns" in pq.read_schema(path).names
        except Exception as error:
            raise DatasetError(f"{path}: cannot read Parquet file ({error})") from error
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetError(f"{path}:{line_number}: malformed JSON ({error.msg})") from error
                return isinstance(record, dict) and "turns" in record
    raise DatasetError(f"{path}: file has no records")


def load_dataset(spec: str, tokenizer: Any | None = None, **kwargs: Any) -> list[Request]:
    """Load a dataset by spec; fills ``isl`` when a tokenizer is given.

    Specs: ``embedded``, ``embedded:small``, ``speed-bench:PATH``, ``jsonl:PATH``, or a bare path
    (``.parquet`` / ``.jsonl`` / ``.json``; SPEED-Bench when records carry ``turns``). Extra keyword
    arguments go to the chosen builder or loader.
    """
    spec = spec.strip()
    if spec in ("embedded", "embedded:small"):
        options = dict(EMBEDDED_SMALL) if spec == "embedded:small" else {}
        if spec == "embedded:small":
            options["name"] = "embedded-small"
        options.update(kwargs)
        return build_embedded_dataset(tokenizer, **options)
    if spec.startswith("embedded:"):
        raise DatasetError(f"unknown embedded variant {spec!r}: use 'embedded' or 'embedded:small'")
    kind, _, rest = spec.partition(":")
    if kind in ("speed-bench", "jsonl") and rest:
        path = Path(rest)
        loader = load_speed_bench if kind == "speed-bench" else load_jsonl_prompts
        requests = loader(path, **kwargs)
    else:
        path = Path(spec)
        if path.suffix.lower() not in (".parquet", ".pq", ".jsonl", ".json", ".ndjson"):
            raise DatasetError(
                f"unknown dataset spec {spec!r}: use embedded, embedded:small, speed-bench:PATH, jsonl:PATH "
                "or a .parquet / .jsonl path"
            )
        loader = load_speed_bench if _looks_like_speed_bench(path) else load_jsonl_prompts
        requests = loader(path, **kwargs)
    return tokenize_requests(requests, tokenizer) if tokenizer is not None else requests


def list_datasets() -> list[dict[str, str]]:
    """The dataset specs ``load_dataset`` understands, for ``rift-ada datasets``."""
    return [
        {
            "name": "embedded",
            "description": (
                f"{EMBEDDED_DEFAULT_REQUESTS} prompts built from CPython's own stdlib sources (low-entropy "
                "code tier) and pydoc topics (high-entropy writing tier), ISL buckets 1K/2K/4K; answers "
                "walk through the input function by function / section by section. No download."
            ),
            "usage": "--dataset embedded",
        },
        {
            "name": "embedded:small",
            "description": (
                f"{EMBEDDED_SMALL['n_requests']} embedded prompts, ISL buckets 1K/2K, "
                f"max {EMBEDDED_SMALL['max_output_tokens']} output tokens (tests and demo)."
            ),
            "usage": "--dataset embedded:small",
        },
        {
            "name": "speed-bench:PATH",
            "description": (
                "SPEED-Bench prompts from a local Parquet or JSONL file (question_id, category, turns); "
                "tier from a tier/entropy column or 'low'/'high' in the file name."
            ),
            "usage": "--dataset speed-bench:/data/speed_bench_high_entropy.parquet",
        },
        {
            "name": "jsonl:PATH",
            "description": (
                'Plain prompts, one JSON object per line: {"id"?, "prompt" | "messages", "category"?, "tier"?}.'
            ),
            "usage": "--dataset jsonl:prompts.jsonl",
        },
    ]


def save_jsonl(requests: Iterable[Request], path: str | Path) -> Path:
    """Write requests as plain JSONL prompts (readable again by :func:`load_jsonl_prompts`)."""
    lines = []
    for request in requests:
        record = {
            "id": request.request_id,
            "dataset": request.dataset,
            "category": request.category,
            "tier": request.tier,
            "messages": request.prompt_messages,
            "max_output_tokens": request.max_output_tokens,
            "reference_response": request.reference_response,
        }
        lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    return atomic_write_text(path, "".join(lines))
