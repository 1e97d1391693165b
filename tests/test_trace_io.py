"""Trace directories (manifest + committed Parquet parts), sharding, and target-response files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rift_ada.collectors.datasets import Request, encode_prompt
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.collectors.targets.files import (
    TargetsError,
    import_targets,
    read_targets,
    read_targets_meta,
    target_row,
    write_targets,
)
from rift_ada.collectors.trace_io import (
    TraceError,
    TraceWriter,
    base_manifest,
    manifest_hash,
    parse_shard,
    read_manifest,
    read_probe_traces,
    read_tables,
    shard_requests,
    trace_status,
    write_probe_traces,
)


def _traces(n_requests: int = 12, osl: int = 203, seed: int = 3) -> ProbeTraces:
    return synthetic_traces(n_requests, osl, vary_length=True, seed=seed, segment_length=64)


def _assert_same(actual: ProbeTraces, expected: ProbeTraces) -> None:
    assert actual.arms == expected.arms
    assert actual.outcome.shape == expected.outcome.shape
    assert np.array_equal(actual.outcome, expected.outcome, equal_nan=True)
    assert np.array_equal(actual.entropy, expected.entropy, equal_nan=True)
    assert set(actual.stride_signals) == set(expected.stride_signals)
    for name, values in expected.stride_signals.items():
        assert np.array_equal(actual.stride_signals[name], values, equal_nan=True), name
    for name, values in expected.requests.items():
        assert np.array_equal(actual.requests[name], values), name
    assert (actual.temperature, actual.draft_length, actual.decision_stride) == (
        expected.temperature,
        expected.draft_length,
        expected.decision_stride,
    )


def _parts(trace_dir: Path, kind: str) -> list[Path]:
    return sorted((trace_dir / kind).glob("*.parquet"))


def test_probe_round_trip_is_exact(tmp_path: Path):
    traces = _traces()
    assert traces.osl.min() < traces.outcome.shape[2]  # some requests are padded with NaN
    write_probe_traces(tmp_path / "t", traces, batch_size=5)
    back = read_probe_traces(tmp_path / "t")
    _assert_same(back, traces)
    assert back.manifest["format"] == "rift-ada.traces" and back.manifest["mode"] == "probe"
    assert back.manifest["arms"] == list(traces.arms)
    assert len(_parts(tmp_path / "t", "positions")) == 3  # 12 requests in batches of 5
    tables = read_tables(tmp_path / "t")
    assert set(tables) == {"requests", "positions", "strides"}
    assert tables["requests"]["request_id"].to_pylist() == sorted(traces.requests["request_id"].tolist())
    assert tables["positions"].num_rows == int(traces.osl.sum()) * len(traces.arms)


def test_t1_traces_and_extra_stride_signals_round_trip(tmp_path: Path):
    traces = synthetic_traces(5, 64, temperature=1.0, vary_length=True, seed=7)
    traces.stride_signals["attention_entropy"] = traces.stride_signals["query_drift"] * 2
    write_probe_traces(tmp_path / "t", traces)
    _assert_same(read_probe_traces(tmp_path / "t"), traces)


def test_resume_skips_complete_requests_and_mismatch_is_refused(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces.subset(range(6)))
    with TraceWriter(out, read_manifest(out)) as writer:
        assert writer.completed_request_ids() == set(traces.requests["request_id"][:6].tolist())
    write_probe_traces(out, traces)  # resumes: writes only the other six
    _assert_same(read_probe_traces(out), traces)
    assert trace_status(out)["n_requests_committed"] == 12

    other = dict(read_manifest(out), temperature=1.0, arms=["age:0", "full"])
    with pytest.raises(TraceError) as error:
        TraceWriter(out, other)
    message = str(error.value)
    assert "temperature: existing 0.0 != new 1.0" in message
    assert "arms:" in message and "draft:" not in message
    with TraceWriter(out, read_manifest(out)) as writer, pytest.raises(TraceError, match="already committed"):
        writer.write_requests(_one_request_tables(traces, 0))


def _one_request_tables(traces: ProbeTraces, index: int) -> dict:
    from rift_ada.collectors.trace_io.readers import _probe_tables

    return _probe_tables(traces, np.array([index]))


def test_truncated_and_garbage_parts_are_named(tmp_path: Path):
    out = tmp_path / "t"
    write_probe_traces(out, _traces(), batch_size=6)
    positions = _parts(out, "positions")[0]
    data = positions.read_bytes()
    positions.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=rf"{positions.name}: corrupt part file"):
        read_probe_traces(out)
    with pytest.raises(TraceError, match=rf"{positions.name}: unreadable Parquet part"):
        read_probe_traces(out, verify=False)
    positions.write_bytes(data)
    strides = _parts(out, "strides")[1]
    strides.write_bytes(b"PAR1 this is not a parquet file PAR1")
    with pytest.raises(TraceError, match=rf"{strides.name}"):
        read_tables(out)
    with pytest.raises(TraceError, match=rf"{strides.name}: unreadable Parquet part"):
        read_tables(out, verify=False)


def test_part_with_wrong_columns_is_named(tmp_path: Path):
    out = tmp_path / "t"
    write_probe_traces(out, _traces())
    positions = _parts(out, "positions")[0]
    pq.write_table(pq.read_table(positions).drop_columns(["entropy"]), positions)
    with pytest.raises(
        TraceError, match=rf"{positions.name}: table 'positions' lacks required column\(s\) \['entropy'\]"
    ):
        read_probe_traces(out, verify=False)


def test_part_without_commit_record_is_ignored_and_rewritten(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces, batch_size=6)
    commits = sorted((out / "_commits").glob("*.json"))
    second = json.loads(commits[1].read_text())
    part_id = second["part_id"]
    # As if killed after staging the tables, before the commit record: files back in _staging/.
    commits[1].unlink()
    for kind in ("requests", "positions", "strides"):
        (out / kind / f"{part_id}.parquet").rename(out / "_staging" / f"{part_id}.{kind}.parquet")
    back = read_probe_traces(out)
    assert back.n_requests == 6
    assert not set(second["request_ids"]) & set(back.requests["request_id"].tolist())
    with TraceWriter(out, read_manifest(out), cleanup=False) as writer:
        assert not set(second["request_ids"]) & writer.completed_request_ids()
    assert len(trace_status(out)["uncommitted_files"]) == 3
    write_probe_traces(out, traces)  # resume: the orphans of shard 0/1 are removed, requests rewritten
    assert trace_status(out)["uncommitted_files"] == []
    _assert_same(read_probe_traces(out), traces)


def test_missing_companion_table_from_another_shard_is_ignored(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    write_probe_traces(out, traces)
    orphan = out / "_staging" / "s1of2-000001-0123456789ab.requests.parquet"
    orphan.write_bytes(b"half-written part of a concurrent shard")
    _assert_same(read_probe_traces(out), traces)
    assert trace_status(out)["uncommitted_files"] == [f"_staging/{orphan.name}"]


def test_manifest_errors_name_file_and_field(tmp_path: Path):
    out = tmp_path / "t"
    write_probe_traces(out, _traces())
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "format": "something-else"}))
    with pytest.raises(TraceError, match=r"manifest\.json: field 'format'"):
        read_probe_traces(out)
    manifest_path.write_text(json.dumps({key: value for key, value in manifest.items() if key != "arms"}))
    with pytest.raises(TraceError, match=r"manifest\.json: field 'arms'"):
        read_manifest(out)
    manifest_path.write_text("{not json")
    with pytest.raises(TraceError, match=r"manifest\.json: invalid JSON"):
        read_manifest(out)
    manifest_path.unlink()
    with pytest.raises(TraceError, match=r"manifest\.json: manifest not found"):
        read_tables(out)


def test_shard_partition_is_disjoint_covering_and_deterministic():
    ids = [f"req-{index:03d}" for index in range(23)]
    shards = [shard_requests(ids, f"{index}/4") for index in range(4)]
    assert sorted(sum(shards, [])) == ids
    assert sum(len(shard) for shard in shards) == len(set(sum(shards, [])))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    shuffled = list(reversed(ids))
    assert sorted(shard_requests(shuffled, (2, 4))) == sorted(shards[2])
    requests = [Request(request_id=i, dataset="d", category="c", tier="low", prompt_messages=[]) for i in ids]
    assert [request.request_id for request in shard_requests(requests, "1/4")] == shards[1]
    assert shard_requests(ids, None) == ids
    assert parse_shard(" 3 / 8 ") == (3, 8)
    for bad in ("4/4", "-1/4", "1/0", "a/b", "3"):
        with pytest.raises(TraceError, match="shard"):
            parse_shard(bad)
    with pytest.raises(TraceError, match="duplicate"):
        shard_requests(["a", "a"], "0/2")


def test_two_shard_writers_share_one_directory(tmp_path: Path):
    traces = _traces()
    out = tmp_path / "t"
    manifest = base_manifest(**traces.manifest, max_positions=traces.outcome.shape[2])
    writers = [TraceWriter(out, manifest, shard=(index, 2)) for index in range(2)]
    ids = traces.requests["request_id"].tolist()
    from rift_ada.collectors.trace_io.readers import _probe_tables

    batches = [[ids.index(i) for i in shard_requests(ids, (index, 2))] for index in range(2)]
    for step in range(0, 6, 2):  # interleaved batches, as two processes would produce them
        for writer, indices in zip(writers, batches, strict=True):
            writer.write_requests(_probe_tables(traces, np.array(indices[step : step + 2])))
    names = [path.name for path in _parts(out, "requests")]
    assert len(names) == 6 and len({name.split("-")[0] for name in names}) == 2
    _assert_same(read_probe_traces(out), traces)


def test_writer_validates_tables(tmp_path: Path):
    traces = _traces()
    writer = TraceWriter(tmp_path / "t", traces.manifest)
    tables = _one_request_tables(traces, 0)
    with pytest.raises(TraceError, match=r"need table kind\(s\) \['strides'\]"):
        writer.write_requests({k: v for k, v in tables.items() if k != "strides"})
    with pytest.raises(TraceError, match=r"'positions' lacks required column\(s\) \['outcome'\]"):
        writer.write_requests({**tables, "positions": tables["positions"].drop_columns(["outcome"])})
    bad_arm = tables["strides"].set_column(1, "arm", pa.array(["age:5"] * tables["strides"].num_rows))
    with pytest.raises(TraceError, match=r"arms \['age:5'\] are not in the manifest"):
        writer.write_requests({**tables, "strides": bad_arm})
    assert writer.write_requests(tables) is not None
    with pytest.raises(TraceError, match="manifest given to TraceWriter: field 'mode'"):
        TraceWriter(tmp_path / "u", {**traces.manifest, "mode": "replay"})


def test_closed_mode_tables_and_manifest_hash(tmp_path: Path):
    manifest = base_manifest(
        mode="closed", draft="d", target="t", temperature=0.0, draft_length=11, decision_stride=8, seed=0
    )
    assert {"created", "versions", "command_line"} <= set(manifest)
    assert manifest["versions"]["python"]
    out = tmp_path / "run"
    writer = TraceWriter(out, manifest)

    def batch(request_ids: list[str]) -> dict:
        n = len(request_ids)
        rounds = np.repeat(request_ids, 3)
        return {
            "requests": {
                "request_id": np.array(request_ids),
                "dataset": np.array(["d"] * n),
                "category": np.array(["c"] * n),
                "tier": np.array(["low"] * n),
                "isl": np.full(n, 1024),
                "osl": np.full(n, 30),
            },
            "rounds": {
                "request_id": rounds,
                "round": np.tile(np.arange(3), n),
                "position": np.tile([0, 10, 20], n),
                "accepted": np.tile([9, 10, 9], n),
                "al": np.tile([10.0, 11.0, 10.0], n),
                "entropy_mean": np.tile([0.5, 0.4, 0.6], n),
                "age": np.tile([0, 10, 20], n),
                "refreshed": np.tile([False, True, False], n),
                "policy_score": np.tile([0.1, 0.9, 0.2], n),
            },
            "strides": pa.table(
                {
                    "request_id": np.repeat(request_ids, 2),
                    "stride": np.tile([0, 1], n),
                    "refreshed": np.tile([0, 1], n),
                    "age": np.tile([8, 16], n),
                    "retained_mass": np.tile([0.9, 0.8], n),
                    "query_drift": np.tile([0.01, 0.05], n),
                }
            ),
        }

    writer.write_requests(batch(["b", "a"]))
    first_hash = manifest_hash(out)
    assert manifest_hash(out) == first_hash and len(first_hash) == 64
    writer.write_requests(batch(["c"]))
    assert manifest_hash(out) != first_hash
    short = batch(["d"])  # a 2-token response (Gemma3 at T = 1 ends one so): one round, no stride of 8 tokens
    short["strides"] = short["strides"].slice(0, 0)
    writer.write_requests(short)  # an empty table once failed the "rows for missing request ids" check
    short_id = batch(["e"])
    short_id["strides"] = short_id["strides"].set_column(0, "request_id", pa.array(["x", "x"]))
    with pytest.raises(TraceError, match="'strides': has rows for request ids missing"):
        writer.write_requests(short_id)
    tables = read_tables(out)
    assert tables["requests"]["request_id"].to_pylist() == ["a", "b", "c", "d"]
    assert tables["strides"].num_rows == 6 and "d" not in tables["strides"]["request_id"].to_pylist()
    assert tables["rounds"].num_rows == 12 and tables["rounds"]["round"].to_pylist()[:3] == [0, 1, 2]
    assert tables["rounds"].schema.field("al").type == pa.float32()
    assert tables["strides"]["refreshed"].type == pa.bool_()
    assert tables["rounds"]["policy_score"].to_pylist()[1] == pytest.approx(0.9)
    with pytest.raises(TraceError, match="field 'mode' is 'closed'"):
        read_probe_traces(out)


def test_a_closed_directory_never_mixes_teacher_forced_and_free_running_runs(tmp_path: Path):
    fields = dict(mode="closed", draft="d", target="t", temperature=1.0, draft_length=11, decision_stride=8, seed=0)
    out = tmp_path / "run"
    TraceWriter(out, base_manifest(**fields))  # written before the field existed: teacher-forced
    TraceWriter(out, base_manifest(**fields, free_running=False))  # the same mode resumes
    with pytest.raises(TraceError, match="free_running: existing false != new true"):
        TraceWriter(out, base_manifest(**fields, free_running=True))


class WordIds:
    """Stub tokenizer: one id per word (its length), decodes to 'w' * id."""

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join("w" * token for token in ids)


def _requests() -> list[Request]:
    return [
        Request(f"r{index}", "d", "qa", "low", [{"role": "user", "content": f"question number {index}"}])
        for index in range(3)
    ]


def test_targets_round_trip_and_errors(tmp_path: Path):
    tokenizer = WordIds()
    rows = []
    for request in _requests():
        prompt = encode_prompt(tokenizer, request.prompt_messages)
        rows.append(target_row(request, prompt, [5, 6, 7], "five six seven", target_model="m", temperature=0.0, seed=1))
    rows[1].pop("seed")
    path = write_targets(tmp_path / "targets.parquet", rows, {"target_model": "m", "seed": 42, "max_new_tokens": 3})
    back = read_targets(path)
    assert [row["request_id"] for row in back] == ["r0", "r1", "r2"]
    assert back[0]["prompt_token_ids"] == [8, 6, 1] and back[0]["isl"] == 3
    assert back[1]["seed"] == 42 and back[0]["seed"] == 1
    assert read_targets_meta(path)["max_new_tokens"] == 3
    assert not list(tmp_path.glob(".*tmp*"))
    with pytest.raises(TargetsError, match="not found"):
        read_targets(tmp_path / "absent.parquet")
    pq.write_table(pq.read_table(path).drop_columns(["response_text"]), tmp_path / "bad.parquet")
    with pytest.raises(TargetsError, match=r"bad\.parquet: targets file lacks column\(s\) \['response_text'\]"):
        read_targets(tmp_path / "bad.parquet")
    with pytest.raises(TargetsError, match="missing required field 'response_token_ids'"):
        write_targets(tmp_path / "x.parquet", [{**rows[0], "response_token_ids": None}], {})


def test_import_targets_from_jsonl(tmp_path: Path):
    path = tmp_path / "external.jsonl"
    records = [
        {"request_id": "r2", "response": "an external answer"},
        {"id": "r0", "response_token_ids": [3, 3], "temperature": 1.0},
    ]
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n")
    rows = import_targets(path, WordIds(), _requests(), target_model="ext")
    assert [row["request_id"] for row in rows] == ["r0", "r2"]
    assert rows[0]["response_text"] == "www www" and rows[0]["temperature"] == 1.0
    assert rows[1]["response_token_ids"] == [2, 8, 6] and rows[1]["target_model"] == "ext"
    write_targets(tmp_path / "t.parquet", rows, {})
    with pytest.raises(TargetsError, match="no response for 1 request"):
        import_targets(path, WordIds(), _requests(), strict=True)
    path.write_text('{"request_id": "r0", "response": "x"}\n{"request_id": "zz", "response": "y"}\n')
    with pytest.raises(TargetsError, match=r"external\.jsonl:2: request id 'zz' is not in the dataset"):
        import_targets(path, WordIds(), _requests())
    path.write_text('{"request_id": "r0"}\n')
    with pytest.raises(TargetsError, match=r"external\.jsonl:1: missing response"):
        import_targets(path, WordIds(), _requests())


def test_token_acceptance_round_trips_and_a_directory_missing_it_for_some_requests_falls_back(tmp_path: Path):
    """T > 0 traces keep token_acceptance through write and read; parts written without it (older
    collections, resumed by a newer one) make the reader warn and drop it for every request, since
    replay must sample one quantity throughout."""
    import dataclasses

    traces = synthetic_traces(4, 40, temperature=1.0, seed=2)
    traces = dataclasses.replace(traces, token_acceptance=np.sqrt(traces.outcome))
    write_probe_traces(tmp_path / "all", traces)
    read = read_probe_traces(tmp_path / "all")
    np.testing.assert_array_equal(read.token_acceptance, traces.token_acceptance.astype(np.float32))
    np.testing.assert_array_equal(read.acceptance, read.token_acceptance)

    older = dataclasses.replace(traces.subset([0, 1]), token_acceptance=None)
    write_probe_traces(tmp_path / "mixed", older)
    write_probe_traces(tmp_path / "mixed", traces)  # adds requests 2 and 3, with the column
    with pytest.warns(UserWarning, match="token_acceptance' is missing for some requests"):
        mixed = read_probe_traces(tmp_path / "mixed")
    assert mixed.token_acceptance is None
    np.testing.assert_array_equal(mixed.acceptance, mixed.outcome)
