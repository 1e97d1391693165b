"""Datasets: the embedded CPython-derived set, SPEED-Bench and JSONL loaders, errors."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rift_ada.collectors.datasets import (
    BUCKET_FILL_MIN,
    HIGH_CATEGORIES,
    LOW_CATEGORIES,
    DatasetError,
    build_embedded_dataset,
    list_datasets,
    load_dataset,
    load_jsonl_prompts,
    load_speed_bench,
    plain_prompt_text,
    save_jsonl,
)


class WordTokenizer:
    """Stub with only ``.encode``: one token per whitespace-separated word."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


class TemplateTokenizer(WordTokenizer):
    """Stub with a chat template that adds 7 tokens and returns a BatchEncoding-like dict."""

    chat_template = "stub"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        assert add_generation_prompt and tokenize
        ids = [0] * 5
        for message in messages:
            ids += self.encode(message["content"])
        return {"input_ids": ids + [0, 0]}


def _serialise(requests) -> bytes:
    return json.dumps([asdict(request) for request in requests], sort_keys=True).encode("utf-8")


def test_embedded_dataset_is_byte_identical_across_builds():
    first = build_embedded_dataset()
    second = build_embedded_dataset()
    assert _serialise(first) == _serialise(second)
    assert _serialise(build_embedded_dataset(seed=1)) != _serialise(first)


def test_embedded_dataset_has_tiers_categories_and_buckets():
    requests = build_embedded_dataset(n_requests=36)
    assert len({request.request_id for request in requests}) == 36
    assert {request.tier for request in requests} == {"low", "high"}
    assert {request.category for request in requests if request.tier == "low"} == set(LOW_CATEGORIES)
    assert {request.category for request in requests if request.tier == "high"} == set(HIGH_CATEGORIES)
    assert {request.isl_bucket for request in requests} == {1024, 2048, 4096}
    for request in requests:
        assert request.isl == 0  # not tokenised
        assert [message["role"] for message in request.prompt_messages] == ["user"]
        content = request.prompt_messages[0]["content"]
        if request.tier == "low":
            assert "function by function" in content and "```python" in content
        else:
            assert "section by section" in content and "## Section 1:" in content
            assert request.metadata["units"] >= 3


def test_embedded_code_outline_follows_source_order():
    requests = [request for request in build_embedded_dataset(n_requests=12) if request.tier == "low"]
    for request in requests:
        content = request.prompt_messages[0]["content"]
        outline = content.split("The definitions appear in this order: ", 1)[1].split(".\n", 1)[0]
        code = content.split("```python", 1)[1]
        names = [name.strip().split(".")[-1] for name in outline.split(",")]
        position = 0
        for name in names:  # each definition is found after the previous one
            match = re.compile(rf"^\s*(?:async def|def|class) {re.escape(name)}\b", re.M).search(code, position)
            assert match is not None, (request.request_id, name)
            position = match.end()


@pytest.mark.parametrize("tokenizer_class", [WordTokenizer, TemplateTokenizer])
def test_embedded_isl_lands_in_buckets(tokenizer_class):
    tokenizer = tokenizer_class()
    requests = build_embedded_dataset(tokenizer, n_requests=18, isl_buckets=(512, 1024, 2048))
    for request in requests:
        assert BUCKET_FILL_MIN * request.isl_bucket <= request.isl <= request.isl_bucket, request.request_id
    if tokenizer_class is WordTokenizer:
        request = requests[0]
        assert request.isl == len(tokenizer.encode(plain_prompt_text(request.prompt_messages)))
    else:
        request = requests[0]
        assert request.isl == len(tokenizer.encode(request.prompt_messages[0]["content"])) + 7


def test_embedded_small_spec_and_kwargs():
    small = load_dataset("embedded:small")
    assert len(small) == 8
    assert {request.isl_bucket for request in small} <= {1024, 2048}
    assert all(request.max_output_tokens == 512 for request in small)
    assert all(request.dataset == "embedded-small" for request in small)
    assert len(load_dataset("embedded", n_requests=4)) == 4
    with pytest.raises(DatasetError, match="embedded:tiny"):
        load_dataset("embedded:tiny")
    tokenised = load_dataset("embedded:small", WordTokenizer(), n_requests=2)
    assert all(request.isl > 0 for request in tokenised)


def _speed_rows() -> list[dict]:
    return [
        {"question_id": "q1", "category": "coding", "turns": ["Write a parser.", "Now add tests."]},
        {"question_id": "q2", "category": "writing", "turns": ["Tell a story."]},
    ]


def test_speed_bench_parquet_with_tier_from_file_name(tmp_path: Path):
    path = tmp_path / "speed_bench_high_entropy.parquet"
    pq.write_table(pa.Table.from_pylist(_speed_rows()), path)
    requests = load_speed_bench(path)
    assert [request.request_id for request in requests] == ["q1", "q2"]
    assert {request.tier for request in requests} == {"high"}
    assert requests[0].category == "coding"
    assert requests[0].prompt_messages == [{"role": "user", "content": "Write a parser."}]
    joined = load_speed_bench(path, turns="concat")
    assert joined[0].prompt_messages[0]["content"] == "Write a parser.\n\nNow add tests."
    via_spec = load_dataset(f"speed-bench:{path}")
    assert [request.request_id for request in via_spec] == ["q1", "q2"]
    assert [request.request_id for request in load_dataset(str(path))] == ["q1", "q2"]


def test_speed_bench_jsonl_with_tier_column(tmp_path: Path):
    path = tmp_path / "speed.jsonl"
    rows = _speed_rows()
    rows[0]["entropy"] = "high_entropy"
    rows[1]["tier"] = "low"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    requests = load_speed_bench(path)
    assert [request.tier for request in requests] == ["high", "low"]
    assert load_speed_bench(path, tier="high")[1].tier == "high"
    bare = load_dataset(str(path), WordTokenizer())  # sniffed as SPEED-Bench: records carry 'turns'
    assert bare[0].dataset == "speed-bench" and bare[0].isl == 3


def test_plain_jsonl_prompts(tmp_path: Path):
    path = tmp_path / "mine.jsonl"
    lines = [
        {"prompt": "Explain KV caches.", "category": "qa"},
        {
            "id": "x2",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        },
        {"prompt": "Write a poem.", "tier": "high", "max_output_tokens": 64},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    requests = load_dataset(f"jsonl:{path}")
    assert [request.request_id for request in requests] == ["mine-00000", "x2", "mine-00002"]
    assert [request.tier for request in requests] == ["low", "low", "high"]
    assert requests[0].category == "qa" and requests[1].category == "default"
    assert requests[1].prompt_messages[0]["role"] == "system"
    assert requests[2].max_output_tokens == 64
    round_trip = load_jsonl_prompts(save_jsonl(requests, tmp_path / "again.jsonl"))
    assert [asdict(request) for request in round_trip] == [asdict(request) for request in requests]


def test_loader_errors_name_file_line_and_field(tmp_path: Path):
    with pytest.raises(DatasetError, match="file not found"):
        load_speed_bench(tmp_path / "absent.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match=r"empty\.jsonl: file is empty"):
        load_jsonl_prompts(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(DatasetError, match="no records"):
        load_jsonl_prompts(blank)
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: malformed JSON"):
        load_jsonl_prompts(malformed)
    missing = tmp_path / "speed.jsonl"
    missing.write_text('{"question_id": 1, "category": "qa", "turns": ["a"]}\n{"question_id": 2, "category": "qa"}\n')
    with pytest.raises(DatasetError, match=r"speed\.jsonl:2: missing required field 'turns'"):
        load_speed_bench(missing)
    no_prompt = tmp_path / "noprompt.jsonl"
    no_prompt.write_text('{"category": "qa"}\n')
    with pytest.raises(DatasetError, match=r"noprompt\.jsonl:1: missing required field 'prompt'"):
        load_jsonl_prompts(no_prompt)
    parquet = tmp_path / "speed.parquet"
    pq.write_table(pa.Table.from_pylist([{"question_id": "q", "turns": ["a"]}]), parquet)
    with pytest.raises(DatasetError, match=r"speed\.parquet: row 1: missing required field 'category'"):
        load_speed_bench(parquet)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"garbage\.parquet: cannot read Parquet"):
        load_speed_bench(garbage)
    duplicate = tmp_path / "dup.jsonl"
    duplicate.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(DatasetError, match="duplicate request id 'a'"):
        load_jsonl_prompts(duplicate)
    with pytest.raises(DatasetError, match="unknown dataset spec"):
        load_dataset("prompts.txt")


def test_list_datasets_describes_every_spec():
    names = [entry["name"] for entry in list_datasets()]
    assert names == ["embedded", "embedded:small", "speed-bench:PATH", "jsonl:PATH"]
    assert all(entry["description"] and entry["usage"] for entry in list_datasets())
