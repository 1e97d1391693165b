"""The embedded dataset: prompts built deterministically from text that ships with CPython (docs/datasets.md)."""

from __future__ import annotations

import ast
import importlib.util
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rift_ada.collectors.datasets.request import DEFAULT_ISL_BUCKETS, TIERS, DatasetError, Request
from rift_ada.collectors.datasets.tokenise import _TokenCounter, estimate_tokens

EMBEDDED_DEFAULT_REQUESTS = 72
EMBEDDED_SMALL = {"n_requests": 8, "isl_buckets": (1024, 2048), "max_output_tokens": 512}
# A built prompt lands in [BUCKET_FILL_MIN * bucket, bucket] tokens (see docs/datasets.md).
BUCKET_FILL_MIN = 0.85

# Pure-Python standard-library modules present (with stable top-level structure) in CPython 3.11+.
EMBEDDED_MODULES: tuple[str, ...] = (
    "textwrap", "shlex", "fnmatch", "glob", "heapq", "colorsys", "calendar", "copy", "difflib",
    "functools", "statistics", "fractions", "csv", "gzip", "base64", "queue", "pprint", "shutil",
    "tempfile", "tokenize", "ipaddress", "configparser", "contextlib", "graphlib", "gettext",
    "mimetypes", "plistlib", "quopri", "random", "dataclasses", "json.decoder", "json.encoder",
    "getopt", "filecmp", "fileinput", "pkgutil", "pyclbr", "py_compile", "traceback", "uuid",
    "zipapp", "linecache", "netrc", "bisect", "secrets", "timeit",
)  # fmt: skip

LOW_CATEGORIES: tuple[str, ...] = ("code-explain", "code-refactor", "code-tests")
HIGH_CATEGORIES: tuple[str, ...] = ("doc-walkthrough", "doc-study-guide", "doc-qa")
_MIN_TOPIC_CHARS = 800
_MAX_SECTIONS = 12

_CODE_TASKS = {
    "code-explain": (
        "Explain the following excerpt of the Python standard-library source ({source}). Go function "
        "by function, in the order they appear in the source: for every function, class and method, "
        "first quote its `def` or `class` line exactly, then explain what it does, its parameters, "
        "its return value and any subtle detail. Do not skip or reorder definitions."
    ),
    "code-refactor": (
        "Refactor the following excerpt of the Python standard-library source ({source}) for "
        "readability. Go function by function, in the order they appear in the source: for every "
        "function, class and method, rewrite it in full with type hints and a docstring, keeping its "
        "behaviour identical, then state in one sentence what you changed. Do not skip or reorder "
        "definitions."
    ),
    "code-tests": (
        "Write pytest unit tests for the following excerpt of the Python standard-library source "
        "({source}). Go function by function, in the order they appear in the source: for every "
        "function and method, quote its signature, then write a test function named after it that "
        "covers a normal case and an edge case. Do not skip or reorder definitions."
    ),
}
_DOC_TASKS = {
    "doc-walkthrough": (
        "Below is a document of {n} sections taken from the Python language reference. Walk through "
        "it section by section, in order. For each section write a heading with its number and "
        "title, quote one or two sentences from it verbatim in quotation marks, then explain the "
        "ideas in your own words with a short example. Do not skip sections."
    ),
    "doc-study-guide": (
        "Below is a document of {n} sections taken from the Python language reference. Write a "
        "study guide that follows the document section by section, in order. For each section give "
        "its number and title, quote the sentence you find most important verbatim, summarise the "
        "section in a paragraph and list two key terms with definitions. Do not skip sections."
    ),
    "doc-qa": (
        "Below is a document of {n} sections taken from the Python language reference. Go through "
        "it section by section, in order. For each section give its number and title, ask one "
        "question a learner might have about it, answer the question, and support the answer with a "
        "verbatim quote from that section. Do not skip sections."
    ),
}




@dataclass(frozen=True)
class _Block:
    """A unit of material: a code chunk (one definition) or a document section."""

    text: str
    label: str  # outline entry: a definition name or a section title
    source: str  # module or topic name


def _read_module_source(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None
    try:
        return Path(origin).read_text(encoding="utf-8")
    except OSError:
        return None


def _definition_start(node: ast.stmt) -> int:
    """First line (1-based) of a definition, counting its decorators."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(decorator.lineno for decorator in decorators)])


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _module_blocks(module: str, source: str) -> list[_Block]:
    """Split a module into contiguous chunks, one per top-level definition and per method."""
    lines = source.splitlines(keepends=True)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    starts: list[tuple[int, str]] = [(1, f"{module} (module header)")]
    for node in tree.body:
        if not isinstance(node, _DEFINITIONS):
            continue
        starts.append((_definition_start(node), node.name))
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, _DEFINITIONS):
                    starts.append((_definition_start(child), f"{node.name}.{child.name}"))
    starts.sort(key=lambda item: item[0])
    blocks = []
    for index, (start, label) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(lines) + 1
        text = "".join(lines[start - 1 : end - 1])
        if text.strip():
            blocks.append(_Block(text=text, label=label, source=module))
    return blocks


def _topic_sections(topics: dict[str, str]) -> list[tuple[str, str, str]]:
    """(topic key, title, body) for every pydoc topic long enough to be a section, sorted by key."""
    sections = []
    for key in sorted(topics):
        text = topics[key].replace("\r\n", "\n").strip("\n")
        lines = text.split("\n")
        if len(lines) > 2 and set(lines[1].strip()) <= set("*=-") and lines[1].strip():
            title, body = lines[0].strip(), "\n".join(lines[2:]).strip("\n")
        else:
            title, body = key, text
        if len(body) >= _MIN_TOPIC_CHARS:
            sections.append((key, title, body))
    return sections


def _cap_section(body: str, max_tokens: int, counter: _TokenCounter) -> str:
    """Leading paragraphs of ``body`` within ``max_tokens`` (at least one, cut at a line if needed)."""
    paragraphs = body.split("\n\n")
    kept: list[str] = []
    used = 0
    for paragraph in paragraphs:
        cost = counter.fragment(paragraph + "\n\n")
        if used + cost > max_tokens:
            break
        kept.append(paragraph)
        used += cost
    if not kept:
        lines_kept: list[str] = []
        for line in paragraphs[0].split("\n"):
            cost = counter.fragment(line + "\n")
            if used + cost > max_tokens and lines_kept:
                break
            lines_kept.append(line)
            used += cost
        kept = ["\n".join(lines_kept)]
    while len(kept) > 1 and kept[-1].rstrip().endswith(":"):
        kept.pop()  # a trailing "Note:" or "For example:" whose body was cut off
    return "\n\n".join(kept)


def _render_code(category: str, blocks: Sequence[_Block]) -> list[dict[str, str]]:
    modules = list(dict.fromkeys(block.source for block in blocks))
    source = ", ".join(f"`{name}`" for name in modules) if modules else "no definitions"
    outline = ", ".join(block.label for block in blocks if not block.label.endswith("(module header)"))
    parts = [_CODE_TASKS[category].format(source=source)]
    if outline:
        parts.append(f"The definitions appear in this order: {outline}.")
    code_lines = []
    current = None
    for block in blocks:
        if block.source != current:
            code_lines.append(f"# ===== Lib/{block.source.replace('.', '/')}.py (excerpt) =====\n")
            current = block.source
        code_lines.append(block.text if block.text.endswith("\n") else block.text + "\n")
    parts.append("```python\n" + "".join(code_lines) + "```")
    return [{"role": "user", "content": "\n\n".join(parts)}]


def _render_doc(category: str, blocks: Sequence[_Block]) -> list[dict[str, str]]:
    titles = "; ".join(f"{index}. {block.label}" for index, block in enumerate(blocks, start=1))
    parts = [_DOC_TASKS[category].format(n=len(blocks)), f"The sections are: {titles}."]
    for index, block in enumerate(blocks, start=1):
        parts.append(f"## Section {index}: {block.label}\n\n{block.text}")
    return [{"role": "user", "content": "\n\n".join(parts)}]


def _fit_blocks(
    candidates: Sequence[_Block],
    render: Callable[[Sequence[_Block]], list[dict[str, str]]],
    counter: _TokenCounter,
    budget: int,
    max_blocks: int | None = None,
    max_refill_trials: int = 16,
) -> tuple[list[_Block], int]:
    """Blocks (in candidate order, skipping any that do not fit) whose rendered prompt fits ``budget``.

    Costs are estimated per block (text, its label twice: outline and heading, framing); the full
    prompt is then measured, trailing blocks are dropped until it fits, and later candidates are
    tried (each measured exactly) to fill the slack.
    """
    limit = len(candidates) if max_blocks is None else max_blocks

    def cost(block: _Block) -> int:
        return counter.fragment(block.text) + 2 * counter.fragment(block.label) + 8

    chosen: list[int] = []
    total = counter.prompt(render([]))
    for index, block in enumerate(candidates):
        if len(chosen) >= limit:
            break
        if total + cost(block) <= budget:
            chosen.append(index)
            total += cost(block)
    measured = counter.prompt(render([candidates[i] for i in chosen]))
    while measured > budget and chosen:
        chosen.pop()
        measured = counter.prompt(render([candidates[i] for i in chosen]))
    trials = 0
    next_index = chosen[-1] + 1 if chosen else 0
    for index in range(next_index, len(candidates)):
        if len(chosen) >= limit or trials >= max_refill_trials:
            break
        if measured + cost(candidates[index]) > budget:
            continue
        trials += 1
        trial = [*chosen, index]
        trial_measured = counter.prompt(render([candidates[i] for i in trial]))
        if trial_measured <= budget:
            chosen, measured = trial, trial_measured
    return [candidates[i] for i in chosen], measured


class _EmbeddedMaterial:
    """Lazily parsed standard-library modules and pydoc topics."""

    def __init__(self) -> None:
        from pydoc_data.topics import topics

        self.sections = _topic_sections(topics)
        self.modules = [name for name in EMBEDDED_MODULES if importlib.util.find_spec(name.split(".")[0])]
        self._blocks: dict[str, list[_Block]] = {}

    def module_blocks(self, module: str) -> list[_Block]:
        if module not in self._blocks:
            source = _read_module_source(module)
            self._blocks[module] = _module_blocks(module, source) if source else []
        return self._blocks[module]


def _code_candidates(material: _EmbeddedMaterial, start: int, skip: int, budget: int) -> list[_Block]:
    """Code blocks from module ``start`` onwards (cyclically) totalling about twice ``budget``."""
    candidates: list[_Block] = []
    chars = 0
    n_modules = len(material.modules)
    for step in range(n_modules):
        blocks = material.module_blocks(material.modules[(start + step) % n_modules])
        if step == 0 and skip:
            blocks = blocks[:1] + blocks[1 + skip % max(1, len(blocks) - 1) :]
        candidates.extend(blocks)
        chars += sum(len(block.text) for block in blocks)
        if chars >= 16 * budget:
            break
    return candidates


def build_embedded_dataset(
    tokenizer: Any | None = None,
    *,
    n_requests: int = EMBEDDED_DEFAULT_REQUESTS,
    isl_buckets: Sequence[int] = DEFAULT_ISL_BUCKETS,
    seed: int = 0,
    max_output_tokens: int | None = 2048,
    name: str = "embedded",
) -> list[Request]:
    """Build the embedded dataset deterministically from CPython's own sources and docs.

    Requests alternate between the low-entropy tier (code: explain / refactor / write tests,
    function by function) and the high-entropy tier (a document of pydoc topics walked section by
    section); categories and ISL buckets cycle within each tier. Prompt lengths are measured with
    ``tokenizer`` (chat template applied when it has one) or estimated as characters / 4, and land
    in ``[0.85 * bucket, bucket]``; ``isl`` is filled only when a tokenizer is given.
    """
    if n_requests < 1:
        raise DatasetError(f"embedded dataset: n_requests must be >= 1, got {n_requests}")
    buckets = tuple(int(bucket) for bucket in isl_buckets)
    if not buckets or min(buckets) < 256:
        raise DatasetError(f"embedded dataset: ISL buckets must be >= 256 tokens, got {buckets}")
    material = _EmbeddedMaterial()
    if not material.modules or not material.sections:
        raise DatasetError("embedded dataset: this Python lacks the standard-library sources or pydoc topics")
    counter = _TokenCounter(tokenizer)
    module_order = list(range(len(material.modules)))
    random.Random(seed).shuffle(module_order)
    requests: list[Request] = []
    for index in range(n_requests):
        tier = TIERS[index % 2]
        slot = index // 2  # position within the tier
        categories = LOW_CATEGORIES if tier == "low" else HIGH_CATEGORIES
        category = categories[slot % len(categories)]
        bucket = buckets[(slot // len(categories)) % len(buckets)]
        rng = random.Random(seed * 1_000_003 + index)
        if tier == "low":
            start = module_order[slot % len(module_order)]
            skip = 3 * (slot // len(module_order))
            candidates = _code_candidates(material, start, skip, bucket)
            chosen, measured = _fit_blocks(
                candidates, lambda blocks, c=category: _render_code(c, blocks), counter, bucket
            )
            messages = _render_code(category, chosen)
            sources = list(dict.fromkeys(block.source for block in chosen))
        else:
            order = list(range(len(material.sections)))
            rng.shuffle(order)
            cap = max(96, bucket // 5)
            floor = bucket // 10  # sections shorter than this would need too many to fill the bucket
            candidates = []
            for section_index in order:
                key, title, body = material.sections[section_index]
                if estimate_tokens(body) < floor:
                    continue
                candidates.append(_Block(text=_cap_section(body, cap, counter), label=title, source=key))
            chosen, measured = _fit_blocks(
                candidates,
                lambda blocks, c=category: _render_doc(c, blocks),
                counter,
                bucket,
                max_blocks=_MAX_SECTIONS,
            )
            messages = _render_doc(category, chosen)
            sources = [block.source for block in chosen]
        requests.append(
            Request(
                request_id=f"{name}-{index:04d}-{category}-{bucket}",
                dataset=name,
                category=category,
                tier=tier,
                prompt_messages=messages,
                isl=measured if tokenizer is not None else 0,
                max_output_tokens=max_output_tokens,
                reference_response=None,
                isl_bucket=bucket,
                metadata={"sources": sources, "units": len(chosen)},
            )
        )
    return requests
