"""Prompt datasets: the embedded CPython-derived set, SPEED-Bench files and plain JSONL prompts.

Every loader returns a list of :class:`Request`. The embedded dataset is built deterministically
from text that ships with CPython (``pydoc_data.topics`` and standard-library sources), so it needs
no download; its prompts ask for answers that move through the input (function by function,
section by section), which is where a stale compressed KV cache shows. See ``docs/datasets.md``.
"""

from __future__ import annotations

from rift_ada.collectors.datasets.embedded import (
    BUCKET_FILL_MIN,
    EMBEDDED_DEFAULT_REQUESTS,
    EMBEDDED_MODULES,
    EMBEDDED_SMALL,
    HIGH_CATEGORIES,
    LOW_CATEGORIES,
    build_embedded_dataset,
)
from rift_ada.collectors.datasets.loaders import (
    list_datasets,
    load_dataset,
    load_jsonl_prompts,
    load_speed_bench,
    read_records,
    save_jsonl,
)
from rift_ada.collectors.datasets.request import DEFAULT_ISL_BUCKETS, ROLES, TIERS, DatasetError, Request, Tier
from rift_ada.collectors.datasets.tokenise import (
    count_prompt_tokens,
    encode_prompt,
    encode_text,
    estimate_tokens,
    has_chat_template,
    plain_prompt_text,
    tokenize_requests,
)

__all__ = [
    "BUCKET_FILL_MIN",
    "DEFAULT_ISL_BUCKETS",
    "DatasetError",
    "EMBEDDED_DEFAULT_REQUESTS",
    "EMBEDDED_MODULES",
    "EMBEDDED_SMALL",
    "HIGH_CATEGORIES",
    "LOW_CATEGORIES",
    "ROLES",
    "Request",
    "TIERS",
    "Tier",
    "build_embedded_dataset",
    "count_prompt_tokens",
    "encode_prompt",
    "encode_text",
    "estimate_tokens",
    "has_chat_template",
    "list_datasets",
    "load_dataset",
    "load_jsonl_prompts",
    "load_speed_bench",
    "plain_prompt_text",
    "read_records",
    "save_jsonl",
    "tokenize_requests",
]
