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
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.collectors.targets.files import TargetsError, read_targets_meta, response_end, targets_provenance
from rift_ada.collectors.targets.generate import generate_response

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

    from rift_ada.collectors.collect import CollectSettings, closed_results, collect_closed
    from rift_ada.experiments.bench import closed_by_position

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


def test_loop_onset_is_the_first_token_of_a_run_of_repeated_ngrams():
    from rift_ada.collectors.loops import loop_onset

    clean = list(range(100, 130))
    # 30 fresh tokens, then 1 2 3 4 five times: the 4-gram at 34 (1 2 3 4) is the first repeat and every
    # later one repeats too, so a run of 8 repeats starts at 34: the text before the loop is clean + one cycle.
    assert loop_onset(clean + [1, 2, 3, 4] * 5, n=4, run=8) == 34
    assert loop_onset(clean, n=4, run=8) is None
    # one repeated phrase (a run of 3 repeats) is not a loop at run=8, but is at run=3
    text = [1, 2, 3, 4, 5, 6] + list(range(50, 60)) + [1, 2, 3, 4, 5, 6] + list(range(70, 80))
    assert loop_onset(text, n=4, run=8) is None and loop_onset(text, n=4, run=3) == 16
    with pytest.raises(ValueError, match="run"):
        loop_onset(text, run=0)


def _staleness_traces() -> ProbeTraces:
    """Two requests (OSL 96, 64), T = 0, K = 11: fresh arms and full KV match everywhere, the prefill
    selection (stat) only in the first 32 positions; retained mass 0.5 (stat) and 0.9 (age:0)."""
    arms = ("age:0", "age:8", "age:16", "stat", "full")
    n_pos, osl = 96, np.array([96, 64])
    outcome = np.ones((2, len(arms), n_pos), dtype=np.float32)
    outcome[:, arms.index("stat"), 32:] = 0.0
    past_end = np.arange(n_pos)[None, :] >= osl[:, None]
    outcome[np.broadcast_to(past_end[:, None, :], outcome.shape)] = np.nan
    mass = np.full((2, len(arms), n_pos // 8), 1.0, dtype=np.float32)
    mass[:, arms.index("stat")] = 0.5
    mass[:, arms.index("age:0")] = 0.9
    mass[1, :, 8:] = np.nan  # request 1 ends at 64: strides 8-11 were never probed
    requests = {
        "request_id": np.array(["long", "short"]),
        "dataset": np.array(["t", "t"]),
        "category": np.array(["c", "c"]),
        "tier": np.array(["low", "low"]),
        "isl": np.array([100, 100]),
        "osl": osl,
    }
    return ProbeTraces(requests, arms, outcome, np.full_like(outcome, 0.5), {"retained_mass": mass}, 0.0, 11, 8)


def test_precheck_headroom_by_position_and_retained_mass_match_a_hand_count():
    from rift_ada.calibrate.precheck import PreCheck, precheck_verdict

    check = PreCheck(intervals=(16, 64), position_bin=32, resamples=500)
    result = check.run(_staleness_traces())
    # periodic:64 would need ages past the oldest arm (16): left out, so periodic:16 is the densest.
    assert result["settings"]["intervals"] == [16] and result["densest"] == "periodic:16"
    # stat, OSL 96: rounds at 0, 12, 24 (AL 12, 12, 9), then 63 rounds of AL 1 -> 66 rounds; OSL 64: 3 + 31.
    stat = [96 / 66, 64 / 34]
    # periodic:16 reads fresh arms only: AL 12 rounds, the last cut at the OSL -> 8 and 6 rounds.
    periodic = [96 / 8, 64 / 6]
    assert result["policies"]["stat"]["mean_al"] == pytest.approx(np.mean(stat))
    assert result["policies"]["periodic:16"]["mean_al"] == pytest.approx(np.mean(periodic))
    headroom = result["headroom"]
    assert headroom["per_request"] == pytest.approx([p - s for p, s in zip(periodic, stat, strict=True)])
    assert headroom["estimate"] == pytest.approx(np.mean(headroom["per_request"]))
    assert headroom["low"] <= headroom["estimate"] <= headroom["high"] and headroom["n"] == 2
    assert precheck_verdict(result).startswith("Staleness exists")
    by_position = result["by_position"]
    assert by_position["edges"][:4] == [0, 32, 64, 96]
    # Bins of 32: stat's rounds starting in [0, 32) commit 12 + 12 + 9 tokens in 3 rounds; later bins AL 1.
    assert by_position["al"]["stat"][:3] == pytest.approx([11.0, 1.0, 1.0])
    assert by_position["n_requests"]["stat"][:3] == [2, 2, 1]  # only the long request reaches [64, 96)
    # periodic:16, bin [32, 64): the long request's rounds at 36, 48, 60 commit 12 each; the short one's
    # last round at 60 is cut at 64 (4 tokens): (12 + 28 / 3) / 2.
    assert by_position["al"]["periodic:16"][:3] == pytest.approx([12.0, (12 + 28 / 3) / 2, 12.0])
    assert result["retained_mass"]["stat"][:3] == pytest.approx([0.5, 0.5, 0.5])
    assert result["retained_mass"]["age:0"][:3] == pytest.approx([0.9, 0.9, 0.9])
    assert result["osl"] == {"min": 64, "mean": 80.0, "max": 96}

    flat = _staleness_traces()
    flat.outcome[:, flat.arm_index("stat")] = flat.outcome[:, flat.arm_index("age:0")]  # stat never goes stale
    unchanged = check.run(flat)
    assert unchanged["headroom"]["estimate"] == 0.0 and precheck_verdict(unchanged).startswith("No staleness")


def test_precheck_report_section_shows_the_numbers_before_calibration_results():
    from rift_ada.calibrate.export import json_safe
    from rift_ada.calibrate.precheck import PreCheck
    from rift_ada.experiments.bench_report import precheck_overview, precheck_section

    check = json_safe(PreCheck(intervals=(16,), position_bin=32, resamples=200).run(_staleness_traces()))
    cell = {"tag": "T0 B128", "temperature": 0.0, "budget": 128, "precheck": check}
    section = "\n".join(precheck_section(cell))
    assert "Staleness exists: refreshing at periodic:16" in section
    assert f"| RIFT-stat | {check['policies']['stat']['mean_al']:.3f} |" in section
    assert "| 0–32 | 32–64 | 64–96 |" in section and "| requests reaching the bin | | | 2 | 2 | 1 |" in section
    assert "| retained mass, RIFT-stat | | | 50.0% | 50.0% | 50.0% |" in section
    overview = "\n".join(precheck_overview({"cells": {"T0 B128": cell, "old": {"tag": "old"}}}))
    headroom = check["headroom"]
    assert f"{headroom['estimate']:+.3f} [{headroom['low']:+.3f}, {headroom['high']:+.3f}]" in overview
    assert "| 0 | 128 | 2 | 80 (64–96) |" in overview and "50.0% → 50.0%" in overview
    assert "Most headroom: T0 B128." in overview
    assert precheck_overview({"cells": {"old": {"tag": "old"}}}) == []  # cells from before the pre-check


def test_bench_target_workload_reports_eos_lengths_and_loops_and_the_report_says_what_size_decides():
    from rift_ada.calibrate.splits import CalibrationError
    from rift_ada.experiments.bench import bench_size, target_workload
    from rift_ada.experiments.bench_report import size_caveat, targets_lines

    rows = [
        {"request_id": "loop", "response_token_ids": [5, 6, 7, 8] * 10},  # 40 tokens, hit the cap
        {"request_id": "ends", "response_token_ids": list(range(10, 30)) + [2]},  # EOS (2) after 20 tokens
    ]
    size = bench_size("small", loop_rule="exclude")
    info = target_workload(rows, size, WordIds(2), {"response_end": "eos_or_cap", "max_new_tokens": 40})
    assert (info["n_responses"], info["ended_at_eos"], info["osl"]) == (2, 1, {"min": 21, "mean": 30.5, "max": 40})
    assert info["loops"]["looping"] == ["loop"] and info["loops"]["kept"] == ["ends"]
    lines = "\n".join(targets_lines({"targets": {"T1": info}}))
    assert "2 responses end at EOS or the 40-token cap (1 at EOS; length 30 mean, 21–40)" in lines
    assert "Looping (seq-rep-4 ≥ 0.3, the share of repeated 4-grams): 1, left out of every cell" in lines
    with pytest.raises(CalibrationError, match="loops.rule"):
        bench_size("small", loop_rule="drop")

    cell = {"confirmation_ids": ["a"] * 6, "table_ids": ["a"] * 2, "precheck": {"headroom": {"sd": 0.3}}}
    caveat = "\n".join(size_caveat({"cells": {"T1 B128": cell}}))
    assert f"≈ {2.8 * 0.3 / 6**0.5:.2f} AL" in caveat and "closed loop on 2 requests: an ordering" in caveat
    assert "cannot decide whether RIFT-ada beats periodic refresh" in caveat
    big = {"confirmation_ids": ["a"] * 400, "table_ids": ["a"] * 400, "precheck": {"headroom": {"sd": 0.3}}}
    assert "cannot decide whether" not in "\n".join(size_caveat({"cells": {"T1 B128": big}}))
    # a cell whose curve verdict decided says so instead of the forecast's "cannot decide"
    decided = "\n".join(size_caveat({"cells": {"T1 B128": {**cell, "curve": {"decided": True}}, "T0 B128": cell}}))
    assert "cannot decide whether" not in decided
    assert "Decided at this size: T1 B128" in decided and "every other cell is underpowered" in decided
