"""`rift-ada evaluate`: replay policies on probe traces and, given a closed-loop run, measure fidelity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rift_ada.collectors.collect import closed_results
from rift_ada.collectors.trace_io import read_manifest, read_probe_traces
from rift_ada.policies.evaluate import evaluate_policies, fidelity, resolve_policy_spec
from rift_ada.policies.replay import replay_many


def evaluate_run(
    traces_dir: str | Path, specs: Sequence[str], *, closed_dir: str | Path | None = None, position_bin: int = 256
) -> dict[str, Any]:
    """Replay ``specs`` on the probe traces; with ``closed_dir``, add the replay-vs-closed-loop gap.

    A closed-loop run labels its policies (``stat``, ``periodic:N``, a controller's name); a replayed
    policy is compared with the closed-loop policy of the same label, on the requests both hold.
    """
    traces = read_probe_traces(traces_dir)
    rows = evaluate_policies(traces, list(specs), position_bin=position_bin)
    for row in rows:
        row["al_fraction_of_full"] = row.get("al_vs_full")
    result: dict[str, Any] = {"traces": str(traces_dir), "policies": rows}
    if closed_dir is None:
        return result
    closed = closed_results(closed_dir)
    result["closed"] = str(closed_dir)
    result["closed_manifest"] = {
        k: read_manifest(closed_dir).get(k) for k in ("mode", "draft", "target", "temperature")
    }
    replayable = [resolve_policy_spec(spec)[1] for spec in specs]
    replays = replay_many(traces, replayable, position_bin=position_bin)
    for row, replayed in zip(rows, replays, strict=True):
        totals = closed.get(row["policy"])
        if totals is not None:
            row["fidelity"] = fidelity(replayed, totals)
    return result
