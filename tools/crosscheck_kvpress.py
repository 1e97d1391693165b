"""Cross-check rift-ada's scorers with NVIDIA kvpress 0.5.5's presses on identical queries and keys.

Run with rift-ada's venv; kvpress runs in its own venv (it pins transformers < 5.3), e.g.::

    python3 -m venv /work/venv-kvpress
    /work/venv-kvpress/bin/pip install torch==2.13.0 && /work/venv-kvpress/bin/pip install kvpress==0.5.5
    OMP_NUM_THREADS=1 .venv/bin/python tools/crosscheck_kvpress.py --kvpress-python /work/venv-kvpress/bin/python

Side 1 (this venv): SmolLM2-135M prefills one embedded prompt cut to ``--prompt-tokens``; per
layer it keeps the attention's input hidden states, the stored (post-RoPE) keys and values and
the queries, and scores them with rift-ada's scorers. Side 2 (the kvpress venv, this file run
with ``--kvpress-side``, importing no rift-ada code): the same checkpoint's attention modules
and kvpress's presses score the same hidden states, keys and values. Side 1 then reports, per
layer and scorer, the Spearman rank correlation of the two scorings and the overlap of their
top-k positions over the positions a baseline selection chooses from (past the 4 sinks, before
the 64-token window).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WINDOW = 64  # the SnapKV baseline's observation window and fixed window
SINKS = 4  # positions Expected Attention and CurDKV always keep
BUDGET = 256  # B of the compared baseline selection: k = B - WINDOW positions are chosen
# name -> (rift-ada scorer spec, kvpress press spec); "pool1": both with pooling off
COMPARISONS = {
    "snapkv": ("snapkv", "snapkv"),
    "snapkv (no pooling)": ("snapkv-pool1", "snapkv-pool1"),
    "expected-attention": ("expected-attention", "expected-attention"),
    "criticalkv": ("criticalkv", "criticalkv"),
    "criticalkv (no pooling)": ("criticalkv-pool1", "criticalkv-pool1"),
    "curdkv": ("curdkv", "curdkv"),
}


# ---- side 2: kvpress (its own venv; no rift-ada imports) ---------------------------------------
def kvpress_side(dump_path: str, out_path: str) -> None:
    import torch
    from kvpress import CriticalKVPress, CURPress, ExpectedAttentionPress, SnapKVPress
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    dump = torch.load(dump_path)
    model = AutoModelForCausalLM.from_pretrained(dump["model_dir"], dtype=torch.float32).eval()
    n = dump["n"]
    k = BUDGET - WINDOW
    kept = k + WINDOW  # kvpress keeps the window (scored max + 1) plus the best k
    ratio = 1 - kept / n  # so CriticalKV's first stage takes int(kept / 2) = window + k / 2 ... see the docs

    def press(spec: str):
        if spec == "snapkv":
            return SnapKVPress(window_size=WINDOW)
        if spec == "snapkv-pool1":
            return SnapKVPress(window_size=WINDOW, kernel_size=1)
        if spec == "expected-attention":
            return ExpectedAttentionPress()
        if spec.startswith("criticalkv"):
            base = SnapKVPress(window_size=WINDOW, kernel_size=1 if spec.endswith("pool1") else 5)
            # stage 1 takes int((1 - ratio) * n * first_stage_ratio): the window plus k / 2
            critical = CriticalKVPress(base, first_stage_ratio=(WINDOW + k // 2) / kept)
            critical.compression_ratio = ratio
            return critical
        if spec == "curdkv":
            return CURPress()
        raise ValueError(spec)

    rotary = model.model.rotary_emb
    positions = torch.arange(n)[None]
    scores: dict[str, list] = {}
    query_error = 0.0
    with torch.no_grad():
        for layer_index, layer in enumerate(model.model.layers):
            module = layer.self_attn
            module.rotary_emb = rotary  # what kvpress's post_init_from_model attaches
            hidden = dump["hidden"][layer_index][None].float()
            keys, values = dump["keys"][layer_index][None].float(), dump["values"][layer_index][None].float()
            position_embeddings = rotary(hidden, positions)
            queries = module.q_proj(hidden).view(1, n, -1, module.head_dim).transpose(1, 2)
            query_error = max(query_error, float((queries - dump["pre_rope_queries"][layer_index][None]).abs().max()))
            kwargs = {"position_embeddings": position_embeddings}
            for _, (_, spec) in COMPARISONS.items():
                got = press(spec).score(module, hidden, keys, values, None, kwargs)
                scores.setdefault(spec, []).append(got[0].float())
    torch.save({"scores": scores, "max_query_error": query_error}, out_path)


# ---- side 1: rift-ada --------------------------------------------------------------------------
def _inputs(layer, queries, query_positions, k: int):
    """A layer's ScoreInputs for a baseline selection of k positions, scored with ``queries``."""
    from rift_ada.scorers import ScoreInputs, SnapKVScorer

    n = layer.length
    keys, values, mass = layer.stored_keys(), layer.values[:, :, :n], SnapKVScorer(obs_window=WINDOW)
    return ScoreInputs(
        keys=keys,
        values=values,
        queries=queries,
        query_positions=query_positions,
        next_position=n,
        scaling=layer.scaling,
        selected=k,
        candidates=n - WINDOW + 1,
        window_mass=lambda: mass.attention_mass(queries, keys, query_positions, layer.scaling),
        rope=layer.rope,
        output_weight=layer.output_weight,
    )


def _rift_scores(model, ids):
    import torch

    from rift_ada.budget import make_policy
    from rift_ada.cache import _attention_modules, make_draft_cache
    from rift_ada.scorers import CriticalKVScorer, CurDKVScorer, ExpectedAttentionScorer, SnapKVScorer

    n = ids.shape[1]
    cache = make_draft_cache(model, make_policy("rift-stat", budget=n, obs_window=n))  # keeps all n queries
    hidden: dict[int, torch.Tensor] = {}
    hooks = [
        module.register_forward_pre_hook(
            lambda mod, args, kwargs, i=index: hidden.__setitem__(i, kwargs["hidden_states"][0].detach().clone()),
            with_kwargs=True,
        )
        for index, module in _attention_modules(model).items()
    ]
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    for hook in hooks:
        hook.remove()
    dump: dict = {"n": n, "hidden": [], "keys": [], "values": [], "pre_rope_queries": []}
    scores: dict[str, list] = {}
    k = BUDGET - WINDOW
    for layer in cache.budgeted_layers:
        keys, values = layer.stored_keys(), layer.values[:, :, :n]
        all_queries, positions = layer.query_buffer, layer.query_positions

        window = _inputs(layer, all_queries[:, :, -WINDOW:], positions[-WINDOW:], k)
        everything = _inputs(layer, all_queries, positions, k)  # kvpress's Expected Attention: every prompt query
        scorers = {
            "snapkv": (SnapKVScorer(obs_window=WINDOW), window),
            "snapkv-pool1": (SnapKVScorer(obs_window=WINDOW, pool_kernel=1), window),
            "expected-attention": (ExpectedAttentionScorer(), everything),
            "criticalkv": (CriticalKVScorer(base=SnapKVScorer(obs_window=WINDOW)), window),
            "criticalkv-pool1": (CriticalKVScorer(base=SnapKVScorer(obs_window=WINDOW, pool_kernel=1)), window),
            "curdkv": (CurDKVScorer(), window),
        }
        with torch.no_grad():
            for spec, (scorer, given) in scorers.items():
                scores.setdefault(spec, []).append(scorer.score(given)[0].float())
            dump["pre_rope_queries"].append(everything.pre_rope_queries[0])
        dump["hidden"].append(hidden[layer.layer_idx])
        dump["keys"].append(keys[0])
        dump["values"].append(values[0])
    return dump, scores


def _compare(ours, theirs, n: int) -> tuple[float, float]:
    """Mean over KV heads of the Spearman correlation and the top-k overlap on positions [SINKS, n - WINDOW)."""
    import numpy as np
    from scipy.stats import spearmanr

    region = slice(SINKS, n - WINDOW)
    k = BUDGET - WINDOW
    rhos, overlaps = [], []
    for head in range(ours.shape[0]):
        a, b = ours[head, region].double().numpy(), theirs[head, region].double().numpy()
        rhos.append(float(spearmanr(a, b).statistic))
        top_a = set(np.argsort(-a, kind="stable")[:k].tolist())
        top_b = set(np.argsort(-b, kind="stable")[:k].tolist())
        overlaps.append(len(top_a & top_b) / k)
    return float(np.mean(rhos)), float(np.mean(overlaps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvpress-python", default="/work/venv-kvpress/bin/python")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("runs/crosscheck-kvpress"))
    parser.add_argument("--kvpress-side", nargs=2, metavar=("DUMP", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kvpress_side:
        kvpress_side(*args.kvpress_side)
        return

    import torch

    from rift_ada.collectors.datasets import encode_prompt
    from rift_ada.collectors.pipeline import load_requests
    from rift_ada.models import _converted_smollm2, load_model, resolve_preset

    torch.set_num_threads(1)
    model, tokenizer = load_model(resolve_preset("smollm2-135m").draft)
    request = next(r for r in load_requests("embedded", tokenizer) if r.isl >= args.prompt_tokens)
    ids = torch.tensor([encode_prompt(tokenizer, request.prompt_messages)[: args.prompt_tokens]])
    dump, ours = _rift_scores(model, ids)
    dump["model_dir"] = str(_converted_smollm2())
    args.out.mkdir(parents=True, exist_ok=True)
    dump_path, theirs_path = args.out / "dump.pt", args.out / "kvpress_scores.pt"
    torch.save(dump, dump_path)
    subprocess.run(
        [args.kvpress_python, __file__, "--kvpress-side", str(dump_path), str(theirs_path)],
        check=True,
        env={**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}, "OMP_NUM_THREADS": "1"},
    )
    theirs = torch.load(theirs_path)
    n = dump["n"]
    rows = {}
    for label, (our_spec, their_spec) in COMPARISONS.items():
        per_layer = [_compare(a, b, n) for a, b in zip(ours[our_spec], theirs["scores"][their_spec], strict=True)]
        rows[label] = {
            "spearman": [round(r, 4) for r, _ in per_layer],
            "topk_overlap": [round(o, 4) for _, o in per_layer],
        }
    report = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python tools/crosscheck_kvpress.py " + " ".join(sys.argv[1:]),
        "request": request.request_id,
        "prompt_tokens": n,
        "budget": BUDGET,
        "k": BUDGET - WINDOW,
        "max_pre_rope_query_error": theirs["max_query_error"],
        "rows": rows,
    }
    (args.out / "crosscheck.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"prompt {request.request_id}: {n} tokens; |q_kvpress - q_rift| max {theirs['max_query_error']:.2e}")
    print(f"{'scorer':<26} {'spearman mean':>13} {'min':>6} {'top-k overlap mean':>18} {'min':>6}")
    for label, row in rows.items():
        s, o = row["spearman"], row["topk_overlap"]
        print(f"{label:<26} {sum(s) / len(s):>13.4f} {min(s):>6.3f} {sum(o) / len(o):>18.4f} {min(o):>6.3f}")
    for label, row in rows.items():
        print(label, "per layer spearman:", " ".join(f"{x:.3f}" for x in row["spearman"]))
        print(label, "per layer top-k overlap:", " ".join(f"{x:.3f}" for x in row["topk_overlap"]))


if __name__ == "__main__":
    main()
