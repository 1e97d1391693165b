"""The workload: targets end at EOS (or are forced, when asked), variable output lengths are handled
end to end, and looping responses are measured against a hand-computed reference."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_models import tiny_model

from rift_ada.collectors.datasets import Request
from rift_ada.collectors.pipeline import LoadedPair, ensure_targets
from rift_ada.collectors.targets import generate_response
from rift_ada.collectors.targets_io import TargetsError, read_targets_meta, response_end, targets_provenance

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class WordIds:
    """Stub tokenizer: one id per word (its length), with a settable EOS id."""

    def __init__(self, eos_token_id: int | None) -> None:
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join("w" * token for token in ids)


def _requests(n: int) -> list[Request]:
    return [
        Request(f"r{i}", "d", "qa", "low", [{"role": "user", "content": f"a {'b' * (i + 1)} cc {i}"}]) for i in range(n)
    ]


def _eos_inside(model, prompt: list[int], length: int) -> tuple[list[int], int, int]:
    """A greedy response without EOS, a token of it to call EOS, and where it first occurs (>= 2)."""
    free = generate_response(model, prompt, max_new_tokens=length)
    for index in range(2, length):
        if free[index] not in free[:index]:
            return free, free[index], index
    raise AssertionError("the tiny model's greedy response repeats one token: pick another seed")


def test_targets_end_at_eos_unless_forced_and_the_file_records_which(tmp_path: Path):
    model = tiny_model("llama", seed=2)
    prompt = WordIds(None).encode("a bb cc 0")
    free, eos, first = _eos_inside(model, prompt, 12)
    # Ending at EOS: the response is the EOS-free response cut just after EOS's first occurrence.
    assert generate_response(model, prompt, max_new_tokens=12, eos_token_id=eos) == free[: first + 1]
    forced = generate_response(model, prompt, max_new_tokens=12, eos_token_id=eos, min_new_tokens=12)
    assert len(forced) == 12 and eos not in forced and forced[:first] == free[:first]

    pair = LoadedPair(SimpleNamespace(target_name="tiny"), model, WordIds(eos), None)
    requests = _requests(3)
    ended = ensure_targets(pair, requests, tmp_path / "eos.parquet", temperature=0.0, seed=0, max_new_tokens=12)
    lengths = [len(row["response_token_ids"]) for row in ended]
    assert all(row["response_token_ids"][-1] == eos or len(row["response_token_ids"]) == 12 for row in ended)
    assert all(eos not in row["response_token_ids"][:-1] for row in ended)
    assert read_targets_meta(tmp_path / "eos.parquet")["response_end"] == "eos_or_cap"
    assert targets_provenance(tmp_path / "eos.parquet")["response_end"] == "eos_or_cap"

    path = tmp_path / "forced.parquet"
    kept = ensure_targets(
        pair, requests, path, temperature=0.0, seed=0, max_new_tokens=12, min_new_tokens=12
    )  # fmt: skip
    assert all(len(row["response_token_ids"]) == 12 for row in kept)
    assert targets_provenance(path)["response_end"] == "forced_length"
    # A forced file is not an EOS-ended one: reusing it for the other workload is refused, naming the field.
    with pytest.raises(TargetsError, match=r"min_new_tokens: file 12 \(forced_length\) != run 0 \(eos_or_cap\)"):
        ensure_targets(pair, requests, path, temperature=0.0, seed=0, max_new_tokens=12)
    assert (response_end(0, 9), response_end(9, 9), response_end(4, 9)) == (
        "eos_or_cap",
        "forced_length",
        "eos_after_min",
    )
    assert lengths  # at least one request ran


def test_al_by_position_with_variable_output_lengths_averages_the_requests_that_reach_each_bin():
    """Replay over requests of different OSLs: per-request AL = OSL / rounds, macro-averaged; each bin's AL is
    the mean over the requests whose rounds start there, each as replayed alone (a request past its end
    adds nothing). ``stat`` / ``full`` read no age arm, so a request's walk does not depend on its index."""
    from rift_ada.collectors.synthetic import synthetic_traces
    from rift_ada.policies.replay import replay

    traces = synthetic_traces(4, 160, seed=3, vary_length=True, arm_ages=(0, 8, 16, 32, 64))
    assert len(set(traces.osl.tolist())) > 1
    for spec in ("stat", "full"):
        together = replay(traces, spec, position_bin=32)
        alone = [replay(traces.subset([r]), spec, position_bin=32) for r in range(traces.n_requests)]
        np.testing.assert_allclose(together.al, [result.al[0] for result in alone])
        np.testing.assert_array_equal(together.committed, traces.osl)
        assert together.mean_al == pytest.approx(np.mean(traces.osl / together.rounds))  # macro, not pooled
        bins = together.to_dict()["al_by_position"]["mean_al"]
        for index, value in enumerate(bins):
            reached = [result.al_by_position[0, index] for result in alone if index * 32 < result.committed[0]]
            if reached:
                assert value == pytest.approx(float(np.mean(reached)))
            else:
                assert value is None
    periodic = replay(traces, "periodic:32", position_bin=32)
    past_end = np.arange(periodic.al_by_position.shape[1])[None, :] * 32 >= traces.osl[:, None]
    assert np.isnan(periodic.al_by_position[past_end]).all() and not np.isnan(periodic.al_by_position[~past_end]).any()


def test_closed_loop_by_position_with_variable_output_lengths(tmp_path: Path):
    """Closed loop over responses of 20 and 72 tokens: AL = committed / rounds per request, and each
    position bin is the mean over the requests whose rounds start there, as each run alone gives it."""
    import torch
    from tiny_models import VOCAB

    from rift_ada.calibrate.bench import closed_by_position
    from rift_ada.collectors.collect import CollectSettings, closed_results, collect_closed

    model = tiny_model("llama", seed=4)
    requests, targets = [], []
    for index, length in enumerate((20, 72)):
        generator = torch.Generator().manual_seed(index)
        prompt = torch.randint(0, VOCAB, (40,), generator=generator).tolist()
        requests.append(Request(f"r{index}", "synthetic", "cat", "low", [{"role": "user", "content": "p"}]))
        response = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
        targets.append({"request_id": f"r{index}", "prompt_token_ids": prompt, "response_token_ids": response})
    settings = CollectSettings(draft="tiny", target="tiny", budget=16, obs_window=4, draft_length=4)
    policies = ["stat", "full"]
    collect_closed(model, requests, targets, tmp_path / "both", settings, policies)
    for index in range(2):
        collect_closed(model, requests[index : index + 1], targets, tmp_path / f"r{index}", settings, policies)
    both = closed_by_position([tmp_path / "both"], bin_size=16)
    alone = [closed_by_position([tmp_path / f"r{index}"], bin_size=16) for index in range(2)]
    for policy in policies:
        results = closed_results(tmp_path / "both")[policy]
        np.testing.assert_allclose(results["al"], results["committed"] / results["rounds"])
        assert sorted(results["committed"].tolist()) == [20, 72]
        curve = both["curves"][policy]
        assert len(curve) == 72 // 16 + 1
        for index, value in enumerate(curve):
            reached = [a["curves"][policy][index] for a in alone if index < len(a["curves"][policy])]
            reached = [v for v in reached if v is not None]
            assert value == pytest.approx(float(np.mean(reached)))
        assert len(alone[0]["curves"][policy]) == 2 and curve[2:] == pytest.approx(alone[1]["curves"][policy][2:])


def test_repeated_ngram_share_matches_a_hand_count():
    from rift_ada.collectors.loops import LoopDetector, repeated_ngram_share

    # 3-grams of 1 2 3 1 2 3 1 2 3: 123 231 312 123 231 312 123; the last four repeat earlier ones.
    assert repeated_ngram_share([1, 2, 3, 1, 2, 3, 1, 2, 3], 3) == pytest.approx(4 / 7)
    # 1-grams of 5 5 5 6: the second and third 5 repeat.
    assert repeated_ngram_share([5, 5, 5, 6], 1) == pytest.approx(2 / 4)
    # 4-grams of 7 8 9 10 7 8 9 11: 7-8-9-10, 8-9-10-7, 9-10-7-8, 10-7-8-9, 7-8-9-11: none repeats.
    assert repeated_ngram_share([7, 8, 9, 10, 7, 8, 9, 11], 4) == 0.0
    assert repeated_ngram_share([1, 2, 3], 4) == 0.0  # no 4-gram at all
    assert repeated_ngram_share([4] * 10, 4) == pytest.approx(6 / 7)

    responses = {"loops": [1, 2, 3, 4] * 6, "fine": list(range(24)), "short": [9, 9]}
    excluding = LoopDetector(n=4, threshold=0.5, rule="exclude").report(responses)
    assert excluding.shares["loops"] == pytest.approx(17 / 21) and excluding.shares["fine"] == 0.0
    assert (excluding.looping, excluding.excluded, excluding.kept) == (["loops"], ["loops"], ["fine", "short"])
    keeping = LoopDetector(n=4, threshold=0.5, rule="keep").report(responses)
    assert (keeping.looping, keeping.excluded, keeping.kept) == (["loops"], [], ["loops", "fine", "short"])
    summary = excluding.to_dict()
    assert summary["settings"] == {"measure": "seq-rep-4", "n": 4, "threshold": 0.5, "rule": "exclude"}
    assert (summary["n_responses"], summary["n_looping"]) == (3, 1)
    rows = [{"request_id": rid, "response_token_ids": tokens} for rid, tokens in responses.items()]
    assert LoopDetector().report_rows(rows).shares == excluding.shares
    for field, bad in (("n", {"n": 0}), ("threshold", {"threshold": 0.0}), ("rule", {"rule": "drop"})):
        with pytest.raises(ValueError, match=f"loops.{field}"):
            LoopDetector(**bad)
