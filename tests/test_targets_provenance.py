"""Targets are inputs: mismatches refused (file unchanged), extension only when asked, provenance recorded."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_models import tiny_model

from rift_ada.calibrate.pipeline import check_traces_match
from rift_ada.calibrate.splits import CalibrationError
from rift_ada.collectors.datasets import Request
from rift_ada.collectors.pipeline import LoadedPair, ensure_targets
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.collectors.targets.files import TargetsError, read_targets, read_targets_meta, targets_provenance
from rift_ada.collectors.targets.store import generate_targets_resumable, parts_dir_of
from rift_ada.collectors.trace_io import TraceError, TraceWriter, base_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class WordIds:
    """Stub tokenizer: one id per word (its length, < the tiny vocabulary), decodes to 'w' * id."""

    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join("w" * token for token in ids)


def _requests(n: int) -> list[Request]:
    messages = [[{"role": "user", "content": f"question {'x' * i} {i}"}] for i in range(n)]
    return [Request(f"r{i}", "d", "qa", "low", messages[i]) for i in range(n)]


def _pair(target_name: str = "tiny-target") -> LoadedPair:
    return LoadedPair(SimpleNamespace(target_name=target_name), tiny_model("llama", seed=2), WordIds(), None)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_mismatched_targets_are_refused_and_the_file_is_unchanged(tmp_path: Path):
    pair, requests = _pair(), _requests(3)
    path = tmp_path / "targets.parquet"
    rows = ensure_targets(pair, requests[:2], path, temperature=0.0, seed=0, max_new_tokens=6)
    assert [row["request_id"] for row in rows] == ["r0", "r1"] and all(len(r["response_token_ids"]) == 6 for r in rows)
    assert read_targets_meta(path)["max_new_tokens"] == 6
    before = _sha(path)

    with pytest.raises(TargetsError) as error:
        ensure_targets(_pair("other-model"), requests, path, temperature=1.0, seed=0, max_new_tokens=8)
    message = str(error.value)
    for expected in (
        "target_model: file 'tiny-target' != run 'other-model'",
        "temperature: file 0.0 != run 1.0",
        "max_new_tokens: file 6 != run 8",
        "no response for 1 request(s) ['r2']",
        "--extend-targets",
        "left unchanged",
    ):
        assert expected in message, message
    with pytest.raises(TargetsError, match=r"no response for 1 request\(s\) \['r2'\]"):
        ensure_targets(pair, requests, path, temperature=0.0, seed=0, max_new_tokens=6)
    with pytest.raises(TargetsError, match="sharded collection needs a complete targets file"):
        ensure_targets(pair, requests, path, temperature=0.0, seed=0, max_new_tokens=6, extend=True, shard="1/2")
    assert _sha(path) == before  # refusals never touch the file
    # The same run reuses it (a subset of requests is fine), in request order.
    again = ensure_targets(pair, requests[1::-1], path, temperature=0.0, seed=0, max_new_tokens=6)
    assert [row["request_id"] for row in again] == ["r1", "r0"] and _sha(path) == before

    extended = ensure_targets(pair, requests, path, temperature=0.0, seed=0, max_new_tokens=6, extend=True)
    assert [row["request_id"] for row in extended] == ["r0", "r1", "r2"]
    assert extended[:2] == rows  # existing rows unchanged
    assert [row["request_id"] for row in read_targets(path)] == ["r0", "r1", "r2"]
    assert not parts_dir_of(path).exists()


def test_sharded_and_resumed_targets_equal_one_shot(tmp_path: Path):
    pair, requests = _pair(), _requests(5)
    settings = {"target_name": "tiny-target", "temperature": 1.0, "seed": 7, "max_new_tokens": 5}
    one_shot = generate_targets_resumable(pair.draft, pair.tokenizer, requests, tmp_path / "a.parquet", **settings)
    assert one_shot.complete and one_shot.generated == 5

    sharded = tmp_path / "b.parquet"
    first = generate_targets_resumable(pair.draft, pair.tokenizer, requests, sharded, shard="1/2", **settings)
    assert (first.complete, first.generated, sharded.exists()) == (False, 2, False)
    with pytest.raises(TargetsError, match=r"temperature: existing 1\.0 != new 0\.0"):
        generate_targets_resumable(pair.draft, pair.tokenizer, requests, sharded, **{**settings, "temperature": 0.0})
    again = generate_targets_resumable(pair.draft, pair.tokenizer, requests, sharded, shard="1/2", **settings)
    assert (again.generated, again.skipped) == (0, 2)
    last = generate_targets_resumable(pair.draft, pair.tokenizer, requests, sharded, shard="0/2", **settings)
    assert last.complete and last.generated == 3 and not parts_dir_of(sharded).exists()
    assert read_targets(sharded) == read_targets(tmp_path / "a.parquet")  # rows, seeds included


def test_targets_provenance_is_checked_on_resume_and_by_calibrate(tmp_path: Path):
    pair, requests = _pair(), _requests(2)
    path = tmp_path / "targets.parquet"
    ensure_targets(pair, requests, path, temperature=0.0, seed=0, max_new_tokens=4)
    provenance = targets_provenance(path)
    assert provenance["sha256"] == _sha(path) and provenance["target_model"] == "tiny-target"
    assert (provenance["temperature"], provenance["max_new_tokens"], provenance["n_responses"]) == (0.0, 4, 2)

    traces = synthetic_traces(2, 16, seed=1)
    manifest = base_manifest(**traces.manifest, targets=provenance)
    with TraceWriter(tmp_path / "t", manifest):
        pass
    other = dict(provenance, sha256="0" * 64, temperature=1.0)
    with pytest.raises(TraceError, match=r"targets\.sha256: existing .* != new \"0000") as error:
        TraceWriter(tmp_path / "t", {**manifest, "targets": other})
    assert "targets.temperature: existing 0.0 != new 1.0" in str(error.value)

    draft, target = manifest["draft"], manifest["target"]
    check_traces_match({**manifest, "targets": dict(provenance, target_model=target)}, draft, target, 0.0)
    with pytest.raises(CalibrationError, match=r"targets\.temperature is 1\.0 in the traces but 0\.0"):
        check_traces_match({**manifest, "targets": dict(provenance, target_model=target, temperature=1.0)},
                           draft, target, 0.0)  # fmt: skip
    with pytest.raises(CalibrationError, match=r"targets\.target_model is 'tiny-target'"):
        check_traces_match(manifest, draft, target, 0.0)
