"""A digest of replay results (every policy family, T = 0 and T = 1) to compare two commits bit for bit.

Run it with each commit's interpreter from that commit's checkout; equal digests mean equal results
(per-request rounds, refreshes, AL, AL by position, refresh positions, replica means)::

    (cd /work/main && .venv/bin/python /path/to/replay_digest.py)
    .venv/bin/python benchmarks/investigations/replay_digest.py

Policies are plain controller dicts (so any commit can build them): 12 periodic, 12 gate trees of
three shapes and 12 score policies fitted on the traces (ScorePolicy.fit, seed 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np

from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.controller import make_controller_dict
from rift_ada.policies import ScorePolicy
from rift_ada.policies.replay import replay_many


def _policies(temperature: float, fitted: ScorePolicy) -> list[dict]:
    identity = {"name": "digest", "draft": "synthetic", "target": "synthetic", "temperature": temperature}
    out = [make_controller_dict({"kind": "periodic", "interval": i}, **identity) for i in range(32, 320, 24)]
    for a in np.linspace(4.0, 7.0, 4):
        trees = [
            {"any": [{"signal": "acceptance", "op": "<=", "value": float(a)}]},
            {"all": [{"signal": "entropy", "op": ">=", "value": 1.3}, {"signal": "acceptance", "op": "<", "value": a}]},
            {
                "any": [
                    {"signal": "acceptance_drop", "op": ">", "value": a / 10},
                    {"all": [{"signal": "entropy_rise", "op": ">=", "value": 0.1}, {"signal": "query_drift", "op": ">=", "value": 0.02}]},  # noqa: E501
                ]
            },
        ]
        out += [make_controller_dict({"kind": "gate", **tree}, **identity) for tree in trees]
    for offset in np.linspace(-0.5, 1.0, 12):
        policy = ScorePolicy(fitted.terms, fitted.threshold + float(offset)).to_policy_json()
        out.append(make_controller_dict(policy, **identity))
    return out


def digest(requests: int, positions: int) -> dict[str, str]:
    found = {}
    for temperature in (0.0, 1.0):
        traces = synthetic_traces(requests, positions, temperature=temperature, seed=0)
        fitted = ScorePolicy().fit(traces.subset(np.arange(min(20, requests))))
        results = replay_many(traces, _policies(temperature, fitted), record_refreshes=True)
        blob = []
        for result in results:
            summary = result.to_dict(per_request=True)
            summary["refresh_positions"] = [p.tolist() for p in result.refresh_positions]
            summary["al_by_position_raw"] = np.nan_to_num(result.al_by_position, nan=-1.0).tolist()
            summary["replica_mean_al"] = None if result.replica_mean_al is None else result.replica_mean_al.tolist()
            blob.append(summary)
        text = json.dumps(blob, sort_keys=True).encode()
        found[f"T={temperature:g}"] = f"{len(results)} policies sha256 {hashlib.sha256(text).hexdigest()[:16]}"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--positions", type=int, default=768)
    args = parser.parse_args()
    for key, value in digest(args.requests, args.positions).items():
        print(key, value)


if __name__ == "__main__":
    main()
