"""Target responses: one Parquet file of fixed target outputs that probe collection teacher-forces.

Columns (see ``docs/traces.md``): request_id, dataset, category, tier, isl, prompt_token_ids
(list<int32>), response_token_ids (list<int32>), response_text, target_model, temperature, seed.
Generation settings and provenance live as JSON in the Parquet schema metadata
(key ``rift_ada.targets``). Responses generated elsewhere are brought in with :func:`import_targets`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rift_ada.atomic import atomic_write
from rift_ada.collectors.datasets import DatasetError, Request, encode_prompt, encode_text, read_records
from rift_ada.collectors.trace_io import package_versions

FORMAT = "rift-ada.targets"
VERSION = 1
META_KEY = b"rift_ada.targets"
TARGET_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("dataset", pa.string()),
        ("category", pa.string()),
        ("tier", pa.string()),
        ("isl", pa.int64()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("response_token_ids", pa.list_(pa.int32())),
        ("response_text", pa.string()),
        ("target_model", pa.string()),
        ("temperature", pa.float64()),
        ("seed", pa.int64()),
    ]
)
TARGET_COLUMNS: tuple[str, ...] = tuple(TARGET_SCHEMA.names)
_REQUIRED_ROW_FIELDS = ("request_id", "dataset", "category", "tier", "prompt_token_ids", "response_token_ids")
_TEXT_FIELDS = ("response_text", "response", "output", "text")
_TOKEN_FIELDS = ("response_token_ids", "output_token_ids", "tokens")
_ID_FIELDS = ("request_id", "id", "question_id")


RESPONSE_ENDS: tuple[str, ...] = ("eos_or_cap", "eos_after_min", "forced_length")


class TargetsError(ValueError):
    """A targets file that cannot be written, read or imported; the message names file and field."""


def response_end(min_new_tokens: int, max_new_tokens: int) -> str:
    """How generated responses end: ``eos_or_cap`` (at EOS or the cap), ``forced_length`` (EOS suppressed
    up to the cap: every response has the cap's length unless a request's own limit is lower) or
    ``eos_after_min`` (EOS suppressed for the first ``min_new_tokens``)."""
    if min_new_tokens <= 0:
        return "eos_or_cap"
    return "forced_length" if min_new_tokens >= max_new_tokens else "eos_after_min"


def target_row(
    request: Request,
    prompt_token_ids: Sequence[int],
    response_token_ids: Sequence[int],
    response_text: str,
    *,
    target_model: str,
    temperature: float,
    seed: int | None,
) -> dict[str, Any]:
    """One targets row for ``request`` (``isl`` is the prompt length in tokens)."""
    return {
        "request_id": request.request_id,
        "dataset": request.dataset,
        "category": request.category,
        "tier": request.tier,
        "isl": len(prompt_token_ids),
        "prompt_token_ids": [int(token) for token in prompt_token_ids],
        "response_token_ids": [int(token) for token in response_token_ids],
        "response_text": response_text,
        "target_model": target_model,
        "temperature": float(temperature),
        "seed": seed,
    }


def _complete_row(row: Mapping[str, Any], meta: Mapping[str, Any], index: int) -> dict[str, Any]:
    for name in _REQUIRED_ROW_FIELDS:
        if row.get(name) is None:
            raise TargetsError(f"targets row {index}: missing required field {name!r}")
    full = {name: row.get(name) for name in TARGET_COLUMNS}
    for name in ("target_model", "temperature", "seed"):
        if full[name] is None:
            full[name] = meta.get(name)
    if full["target_model"] is None or full["temperature"] is None:
        raise TargetsError(
            f"targets row {index} ({row['request_id']!r}): 'target_model' and 'temperature' must be given "
            "in the row or in meta"
        )
    if full["isl"] is None:
        full["isl"] = len(full["prompt_token_ids"])
    if full["response_text"] is None:
        full["response_text"] = ""
    return full


def write_targets(path: str | Path, rows: Iterable[Mapping[str, Any]], meta: Mapping[str, Any]) -> Path:
    """Write target rows atomically (``rift_ada.atomic``); ``meta`` goes to schema metadata.

    ``target_model`` / ``temperature`` / ``seed`` missing from a row are taken from ``meta``.
    """
    path = Path(path)
    completed = [_complete_row(row, meta, index) for index, row in enumerate(rows)]
    seen: set[str] = set()
    for row in completed:
        if row["request_id"] in seen:
            raise TargetsError(f"{path}: duplicate request id {row['request_id']!r}")
        seen.add(row["request_id"])
    full_meta = {
        "format": FORMAT,
        "version": VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": package_versions(),
        **dict(meta),
    }
    try:
        table = pa.Table.from_pylist(completed, schema=TARGET_SCHEMA)
        encoded_meta = json.dumps(full_meta, sort_keys=True, default=str).encode("utf-8")
    except (pa.ArrowException, TypeError, ValueError) as error:
        raise TargetsError(f"{path}: cannot encode target rows ({error})") from error
    table = table.replace_schema_metadata({META_KEY: encoded_meta})
    atomic_write(path, lambda temporary: pq.write_table(table, temporary, compression="zstd"))
    return path


def _read_table(path: Path) -> pa.Table:
    if not path.is_file():
        raise TargetsError(f"{path}: targets file not found")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise TargetsError(f"{path}: unreadable targets Parquet ({error})") from error
    missing = [name for name in TARGET_COLUMNS if name not in table.column_names]
    if missing:
        raise TargetsError(f"{path}: targets file lacks column(s) {missing}")
    return table


def read_targets(path: str | Path) -> list[dict[str, Any]]:
    """Target rows as dicts (token ids as lists of int), in file order."""
    path = Path(path)
    rows = _read_table(path).select(list(TARGET_COLUMNS)).to_pylist()
    for index, row in enumerate(rows):
        for name in ("request_id", "prompt_token_ids", "response_token_ids"):
            if row[name] is None:
                raise TargetsError(f"{path}: row {index + 1}: field {name!r} is null")
    return rows


def read_targets_meta(path: str | Path) -> dict[str, Any]:
    """The generation settings and provenance stored with a targets file."""
    path = Path(path)
    metadata = _read_table(path).schema.metadata or {}
    if META_KEY not in metadata:
        return {}
    try:
        return json.loads(metadata[META_KEY])
    except json.JSONDecodeError as error:
        raise TargetsError(f"{path}: corrupt targets metadata ({error})") from error


def targets_sha256(path: str | Path) -> str:
    """sha256 (hex) of a targets file's bytes: its identity in trace manifests."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _settings_of(path: Path, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """target_model / temperature / seed / max_new_tokens / min_new_tokens / response_end of a targets file:
    its metadata, else its rows (``response_end`` derived from the token limits in files older than it)."""
    meta = read_targets_meta(path)
    names = ("target_model", "temperature", "seed", "max_new_tokens", "min_new_tokens", "response_end")
    settings = {name: meta.get(name) for name in names}
    if settings["response_end"] is None and None not in (settings["min_new_tokens"], settings["max_new_tokens"]):
        settings["response_end"] = response_end(int(settings["min_new_tokens"]), int(settings["max_new_tokens"]))
    for name in ("target_model", "temperature"):
        values = {row[name] for row in rows if row.get(name) is not None}
        if settings[name] is None and len(values) == 1:
            settings[name] = values.pop()
    return settings


def targets_provenance(path: str | Path) -> dict[str, Any]:
    """What a trace manifest records about its targets: path, sha256, model, temperature, seed, token limits,
    how responses end (``response_end``), count."""
    path = Path(path)
    rows = read_targets(path)
    return {"path": str(path), "sha256": targets_sha256(path), "n_responses": len(rows), **_settings_of(path, rows)}


def targets_differences(
    path: str | Path,
    *,
    target_model: str,
    temperature: float,
    seed: int,
    max_new_tokens: int,
    request_ids: Iterable[str],
    min_new_tokens: int | None = None,
) -> tuple[list[str], list[str]]:
    """(settings that differ from the run, request ids the file lacks) for an existing targets file.

    Compared: ``target_model`` (``external`` imports match any model), ``temperature``, ``seed``
    (only when T > 0: greedy responses do not depend on it), ``max_new_tokens`` and, when given,
    ``min_new_tokens`` (each when the file records it: responses that end at EOS are not responses
    forced to the cap). Extra responses in the file are fine: a run uses the ones it needs.
    """
    path = Path(path)
    rows = read_targets(path)
    have = _settings_of(path, rows)
    differences = []
    if have["target_model"] not in (target_model, "external"):
        differences.append(f"target_model: file {have['target_model']!r} != run {target_model!r}")
    if have["temperature"] is None or float(have["temperature"]) != float(temperature):
        differences.append(f"temperature: file {have['temperature']} != run {float(temperature)}")
    if float(temperature) > 0 and have["seed"] is not None and int(have["seed"]) != int(seed):
        differences.append(f"seed: file {have['seed']} != run {seed}")
    if have["max_new_tokens"] is not None and int(have["max_new_tokens"]) != int(max_new_tokens):
        differences.append(f"max_new_tokens: file {have['max_new_tokens']} != run {max_new_tokens}")
    if None not in (min_new_tokens, have["min_new_tokens"]) and int(have["min_new_tokens"]) != int(min_new_tokens):
        differences.append(
            f"min_new_tokens: file {have['min_new_tokens']} ({have['response_end']}) != run {min_new_tokens} "
            f"({response_end(int(min_new_tokens), int(max_new_tokens))})"
        )
    present = {row["request_id"] for row in rows}
    missing = [request_id for request_id in request_ids if request_id not in present]
    return differences, missing


def _first(record: Mapping[str, Any], names: Sequence[str]) -> tuple[str | None, Any]:
    for name in names:
        if record.get(name) is not None:
            return name, record[name]
    return None, None


def import_targets(
    path: str | Path,
    tokenizer: Any,
    requests: Sequence[Request],
    *,
    target_model: str = "external",
    temperature: float = 0.0,
    seed: int | None = None,
    strict: bool = False,
) -> list[dict[str, Any]]:
    """Target rows from externally generated responses (JSONL or Parquet) for ``requests``.

    Each record needs a request id (``request_id`` / ``id`` / ``question_id``) and either response
    text (``response_text`` / ``response`` / ``output`` / ``text``, tokenised with ``tokenizer``)
    or token ids (``response_token_ids`` / ``output_token_ids`` / ``tokens``, decoded for
    ``response_text`` when the tokenizer can). Optional per-record ``target_model``,
    ``temperature``, ``seed`` override the arguments. Requests without a response are skipped
    unless ``strict``. Rows come back in ``requests`` order, ready for :func:`write_targets`.
    """
    path = Path(path)
    if tokenizer is None:
        raise TargetsError(f"{path}: importing targets needs the draft/target tokenizer")
    by_id = {request.request_id: request for request in requests}
    try:
        records = read_records(path)
    except DatasetError as error:
        raise TargetsError(str(error)) from error
    imported: dict[str, dict[str, Any]] = {}
    for where, record in records:
        _, raw_id = _first(record, _ID_FIELDS)
        if raw_id is None:
            raise TargetsError(f"{where}: missing required field 'request_id'")
        request_id = str(raw_id)
        request = by_id.get(request_id)
        if request is None:
            raise TargetsError(f"{where}: request id {request_id!r} is not in the dataset")
        if request_id in imported:
            raise TargetsError(f"{where}: duplicate response for request {request_id!r}")
        token_field, tokens = _first(record, _TOKEN_FIELDS)
        _, text = _first(record, _TEXT_FIELDS)
        if tokens is not None:
            if not isinstance(tokens, list) or not all(isinstance(token, int) for token in tokens):
                raise TargetsError(f"{where}: field {token_field!r} must be a list of integers")
            if text is None:
                decode = getattr(tokenizer, "decode", None)
                text = decode(tokens) if callable(decode) else ""
        elif text is not None:
            if not isinstance(text, str):
                raise TargetsError(f"{where}: response text must be a string")
            tokens = encode_text(tokenizer, text)
        else:
            raise TargetsError(
                f"{where}: missing response: give 'response_text' (or 'response') or 'response_token_ids'"
            )
        if not tokens:
            raise TargetsError(f"{where}: empty response for request {request_id!r}")
        imported[request_id] = target_row(
            request,
            encode_prompt(tokenizer, request.prompt_messages),
            tokens,
            str(text),
            target_model=str(record.get("target_model") or target_model),
            temperature=float(record["temperature"]) if record.get("temperature") is not None else temperature,
            seed=int(record["seed"]) if record.get("seed") is not None else seed,
        )
    missing = [request.request_id for request in requests if request.request_id not in imported]
    if strict and missing:
        raise TargetsError(f"{path}: no response for {len(missing)} request(s), e.g. {missing[:5]}")
    return [imported[request.request_id] for request in requests if request.request_id in imported]


__all__ = [
    "RESPONSE_ENDS",
    "TARGET_COLUMNS",
    "TARGET_SCHEMA",
    "TargetsError",
    "import_targets",
    "read_targets",
    "read_targets_meta",
    "response_end",
    "target_row",
    "targets_differences",
    "targets_provenance",
    "targets_sha256",
    "write_targets",
]
