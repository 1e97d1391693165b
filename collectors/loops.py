"""Looping responses: the share of repeated n-grams in a target response (model-free).

A response *loops* when much of it repeats itself: greedy small models, asked for a long answer,
often cycle through the same few lines. A looping response is easy for any draft (the recent
window predicts it), so it hides the staleness a refresh controller exists to fix.

The measure is seq-rep-n (Welleck et al., 2019, "Neural Text Generation with Unlikelihood
Training"): of the response's ``L - n + 1`` token n-grams, the share that repeat an n-gram seen
earlier in the same response, ``1 - unique / total``. A response shorter than ``n`` tokens has no
n-grams and a share of 0. A response loops when its share is >= ``threshold``.

The rule applied to looping responses is a field: ``keep`` (report them, run them) or
``exclude`` (report them and leave them out of the workload). Whoever applies it records
:meth:`LoopDetector.settings` and the :class:`LoopReport` beside the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

LoopRule = Literal["keep", "exclude"]
LOOP_RULES: tuple[str, ...] = ("keep", "exclude")


def repeated_ngram_share(tokens: Sequence[int], n: int = 4) -> float:
    """seq-rep-n of ``tokens``: the share of its n-grams that occurred earlier in it (0 if fewer than n tokens)."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for start in range(total):
        gram = tuple(tokens[start : start + n])
        if gram in seen:
            repeats += 1
        else:
            seen.add(gram)
    return repeats / total


def loop_onset(tokens: Sequence[int], n: int = 4, run: int = 8) -> int | None:
    """Where a loop starts: the first token of the first ``run`` consecutive n-grams that each repeat an
    earlier one (so ``tokens[:onset]`` is the text before it); None when no such run exists."""
    if n < 1 or run < 1:
        raise ValueError(f"n and run: must be >= 1, got n={n}, run={run}")
    seen: set[tuple[int, ...]] = set()
    streak = 0
    for start in range(len(tokens) - n + 1):
        gram = tuple(tokens[start : start + n])
        streak = streak + 1 if gram in seen else 0
        seen.add(gram)
        if streak == run:
            return start - run + 1
    return None


@dataclass
class LoopReport:
    """Per response: its repeated-n-gram share and whether it loops; which requests the rule keeps."""

    settings: dict[str, Any]
    shares: dict[str, float]  # request id -> seq-rep-n
    looping: list[str]  # request ids at or over the threshold, in input order
    kept: list[str]  # request ids the rule keeps, in input order
    excluded: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"n_responses": len(self.shares), "n_looping": len(self.looping)}


@dataclass(frozen=True)
class LoopDetector:
    """Flags target responses whose share of repeated ``n``-grams is >= ``threshold``; ``rule`` says what to do."""

    n: int = 4
    threshold: float = 0.3
    rule: LoopRule = "exclude"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"loops.n: must be >= 1, got {self.n}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"loops.threshold: must be in (0, 1], got {self.threshold}")
        if self.rule not in LOOP_RULES:
            raise ValueError(f"loops.rule: must be one of {list(LOOP_RULES)}, got {self.rule!r}")

    def share(self, tokens: Sequence[int]) -> float:
        return repeated_ngram_share(tokens, self.n)

    def is_looping(self, tokens: Sequence[int]) -> bool:
        return self.share(tokens) >= self.threshold

    def settings(self) -> dict[str, Any]:
        return {"measure": f"seq-rep-{self.n}", "n": self.n, "threshold": self.threshold, "rule": self.rule}

    def report(self, responses: Mapping[str, Sequence[int]]) -> LoopReport:
        """Shares and the rule's decision for responses given as {request id: token ids} (order kept)."""
        shares = {rid: self.share(tokens) for rid, tokens in responses.items()}
        looping = [rid for rid, share in shares.items() if share >= self.threshold]
        excluded = looping if self.rule == "exclude" else []
        kept = [rid for rid in shares if rid not in set(excluded)]
        return LoopReport(self.settings(), shares, looping, kept, list(excluded))

    def report_rows(self, rows: Sequence[Mapping[str, Any]]) -> LoopReport:
        """:meth:`report` over targets rows (``request_id``, ``response_token_ids``)."""
        return self.report({str(row["request_id"]): list(row["response_token_ids"]) for row in rows})


__all__ = ["LOOP_RULES", "LoopDetector", "LoopReport", "LoopRule", "loop_onset", "repeated_ngram_share"]
