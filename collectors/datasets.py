"""Prompt datasets: the embedded CPython-derived set, SPEED-Bench files and plain JSONL prompts.

Every loader returns a list of :class:`Request`. The embedded dataset is built deterministically
from text that ships with CPython (``pydoc_data.topics`` and standard-library sources), so it needs
no download; its prompts ask for answers that move through the input (function by function,
section by section), which is where a stale compressed KV cache shows. See ``docs/datasets.md``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rift_ada.atomic import atomic_write_text

Tier = Literal["low", "high"]
TIERS: tuple[str, ...] = ("low", "high")
ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})
DEFAULT_ISL_BUCKETS: tuple[int, ...] = (1024, 2048, 4096)
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


class DatasetError(ValueError):
    """A dataset file or spec that cannot be loaded; the message names the file, line and field."""


@dataclass
class Request:
    """One prompt to run: chat messages plus the labels used to stratify splits and reports."""

    request_id: str
    dataset: str
    category: str
    tier: str
    prompt_messages: list[dict[str, str]]
    isl: int = 0
    max_output_tokens: int | None = None
    reference_response: str | None = None
    isl_bucket: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Request:
        return cls(**data)


# --------------------------------------------------------------------------------------------
# Tokenisation helpers (shared with targets and collection)
# --------------------------------------------------------------------------------------------


def _raw_ids(output: Any) -> list[Any]:
    """Normalise what a tokenizer returns (list, BatchEncoding, tensor, nested batch) to a flat list."""
    if hasattr(output, "keys") and "input_ids" in output:
        output = output["input_ids"]
    if hasattr(output, "tolist"):
        output = output.tolist()
    output = list(output)
    if output and isinstance(output[0], list | tuple):
        output = list(output[0])
    return output


def _as_id_list(output: Any) -> list[int]:
    return [int(token) for token in _raw_ids(output)]


def plain_prompt_text(messages: Sequence[dict[str, str]]) -> str:
    """Prompt text for tokenizers without a chat template: the message contents, blank-line joined."""
    return "\n\n".join(message["content"] for message in messages)


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` can render chat messages (a transformers tokenizer with a template)."""
    if not callable(getattr(tokenizer, "apply_chat_template", None)):
        return False
    return getattr(tokenizer, "chat_template", True) is not None


def encode_prompt(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt, with the generation prompt appended when a template exists."""
    if has_chat_template(tokenizer):
        output = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        return _as_id_list(output)
    return _as_id_list(tokenizer.encode(plain_prompt_text(messages)))


def count_prompt_tokens(tokenizer: Any, messages: Sequence[dict[str, str]]) -> int:
    """Prompt length in tokens (as :func:`encode_prompt`, also for tokenizers returning non-int tokens)."""
    if has_chat_template(tokenizer):
        output = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        return len(_raw_ids(output))
    return len(_raw_ids(tokenizer.encode(plain_prompt_text(messages))))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a text fragment, without special tokens where the tokenizer supports that."""
    try:
        return _as_id_list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return _as_id_list(tokenizer.encode(text))


def estimate_tokens(text: str) -> int:
    """Token estimate used when no tokenizer is given: ceil(characters / 4)."""
    return -(-len(text) // 4)


def _estimate_prompt_tokens(messages: Sequence[dict[str, str]]) -> int:
    return sum(estimate_tokens(message["content"]) + 4 for message in messages)


def tokenize_requests(requests: Iterable[Request], tokenizer: Any) -> list[Request]:
    """Copies of ``requests`` with ``isl`` set to the prompt length in ``tokenizer``'s tokens."""
    return [replace(request, isl=count_prompt_tokens(tokenizer, request.prompt_messages)) for request in requests]


class _TokenCounter:
    """Counts prompt and fragment tokens with a tokenizer (cached) or the chars/4 estimate."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._fragment_cache: dict[str, int] = {}

    def fragment(self, text: str) -> int:
        if self.tokenizer is None:
            return estimate_tokens(text)
        count = self._fragment_cache.get(text)
        if count is None:
            try:
                count = len(_raw_ids(self.tokenizer.encode(text, add_special_tokens=False)))
            except TypeError:
                count = len(_raw_ids(self.tokenizer.encode(text)))
            self._fragment_cache[text] = count
        return count

    def prompt(self, messages: Sequence[dict[str, str]]) -> int:
        if self.tokenizer is None:
            return _estimate_prompt_tokens(messages)
        return count_prompt_tokens(self.tokenizer, messages)


# --------------------------------------------------------------------------------------------
# Embedded dataset
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# File loaders
# --------------------------------------------------------------------------------------------


def _tier_from_value(value: Any) -> str | None:
    """'low' / 'high' from a tier-like value ('low', 'high_entropy', 'mixed' -> 'high'), else None."""
    if value is None or isinstance(value, bool):
        return None
    tokens = [token for token in re.split(r"[^a-z0-9]+", str(value).lower()) if token]
    for token in tokens:
        if token.startswith("low"):
            return "low"
        if token.startswith(("high", "mixed", "medium", "mid")):
            return "high"
    return None


def _tier_from_path(path: Path) -> str | None:
    return _tier_from_value(path.name)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DatasetError(f"{path}: file not found")
    if not path.is_file():
        raise DatasetError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: file is empty")


def read_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, record) pairs from a JSONL or Parquet file; errors name the file and line (or row)."""
    _check_file(path)
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if ".parquet" in suffixes or ".pq" in suffixes:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises several types for corrupt files
            raise DatasetError(f"{path}: cannot read Parquet file ({error})") from error
        records = [(f"{path}: row {index + 1}", row) for index, row in enumerate(rows)]
    else:
        records = []
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetError(f"{path}:{line_number}: malformed JSON ({error.msg})") from error
                if not isinstance(record, dict):
                    kind = type(record).__name__
                    raise DatasetError(f"{path}:{line_number}: expected a JSON object, got {kind}")
                records.append((f"{path}:{line_number}", record))
    if not records:
        raise DatasetError(f"{path}: file has no records")
    return records


def _require(record: dict[str, Any], name: str, where: str) -> Any:
    value = record.get(name)
    if value is None or (isinstance(value, str | list) and len(value) == 0):
        raise DatasetError(f"{where}: missing required field {name!r}")
    return value


def _check_messages(messages: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DatasetError(f"{where}: messages[{index}] needs 'role' and 'content'")
        if message["role"] not in ROLES or not isinstance(message["content"], str):
            raise DatasetError(
                f"{where}: messages[{index}] has role {message['role']!r} (expected one of "
                f"{sorted(ROLES)}) or non-string content"
            )
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def _check_unique(requests: Sequence[Request], path: Path) -> None:
    seen: set[str] = set()
    for request in requests:
        if request.request_id in seen:
            raise DatasetError(f"{path}: duplicate request id {request.request_id!r}")
        seen.add(request.request_id)


def _optional_int(record: dict[str, Any], name: str, where: str) -> int | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        raise DatasetError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
    return int(value)


def load_speed_bench(
    path: str | Path,
    *,
    turns: Literal["first", "concat"] = "first",
    tier: str | None = None,
    dataset: str = "speed-bench",
    max_output_tokens: int | None = None,
) -> list[Request]:
    """Load SPEED-Bench prompts from Parquet or JSONL (fields ``question_id``, ``category``, ``turns``).

    ``turns="first"`` uses the first user turn; ``"concat"`` joins all turns into one user message.
    The tier comes from ``tier`` if given, else a ``tier`` / ``entropy`` / ``entropy_tier`` / ``split``
    field, else the category, else the file name (containing "low" or "high"), else "low".
    """
    path = Path(path)
    forced = _tier_from_value(tier) if tier is not None else None
    if tier is not None and forced is None:
        raise DatasetError(f"{path}: tier must be 'low' or 'high', got {tier!r}")
    file_tier = _tier_from_path(path)
    requests = []
    for where, record in read_records(path):
        question_id = _require(record, "question_id", where)
        category = _require(record, "category", where)
        raw_turns = _require(record, "turns", where)
        if isinstance(raw_turns, str):
            raw_turns = [raw_turns]
        if not isinstance(raw_turns, list) or not all(isinstance(turn, str) for turn in raw_turns):
            raise DatasetError(f"{where}: field 'turns' must be a list of strings")
        content = raw_turns[0] if turns == "first" else "\n\n".join(raw_turns)
        row_tier = forced
        for name in ("tier", "entropy", "entropy_tier", "split"):
            if row_tier is None:
                row_tier = _tier_from_value(record.get(name))
        row_tier = row_tier or _tier_from_value(category) or file_tier or "low"
        requests.append(
            Request(
                request_id=str(question_id),
                dataset=dataset,
                category=str(category),
                tier=row_tier,
                prompt_messages=[{"role": "user", "content": content}],
                max_output_tokens=_optional_int(record, "max_output_tokens", where) or max_output_tokens,
                reference_response=None,
                metadata={"turns": len(raw_turns)},
            )
        )
    _check_unique(requests, path)
    return requests


def load_jsonl_prompts(
    path: str | Path, *, dataset: str | None = None, max_output_tokens: int | None = None
) -> list[Request]:
    """Load plain prompts: one JSON object per line with ``prompt`` or ``messages`` (+ optional fields).

    Optional fields: ``id``, ``category`` (default "default"), ``tier`` (default from the file name,
    else "low"), ``dataset``, ``max_output_tokens``, ``reference_response``.
    """
    path = Path(path)
    file_tier = _tier_from_path(path)
    default_dataset = dataset or path.stem.split(".")[0]
    requests = []
    for ordinal, (where, record) in enumerate(read_records(path)):
        if record.get("messages") is not None:
            messages = _check_messages(record["messages"], where)
        elif record.get("prompt") is not None:
            if not isinstance(record["prompt"], str) or not record["prompt"]:
                raise DatasetError(f"{where}: field 'prompt' must be a non-empty string")
            messages = [{"role": "user", "content": record["prompt"]}]
        else:
            raise DatasetError(f"{where}: missing required field 'prompt' (or 'messages')")
        row_tier = file_tier or "low"
        if record.get("tier") is not None:
            row_tier = _tier_from_value(record["tier"])
            if row_tier is None:
                raise DatasetError(f"{where}: field 'tier' must be 'low' or 'high', got {record['tier']!r}")
        reference = record.get("reference_response")
        request_id = str(record["id"]) if record.get("id") is not None else f"{default_dataset}-{ordinal:05d}"
        requests.append(
            Request(
                request_id=request_id,
                dataset=str(record.get("dataset") or default_dataset),
                category=str(record.get("category") or "default"),
                tier=row_tier,
                prompt_messages=messages,
                max_output_tokens=_optional_int(record, "max_output_tokens", where) or max_output_tokens,
                reference_response=str(reference) if reference is not None else None,
            )
        )
    _check_unique(requests, path)
    return requests


def _looks_like_speed_bench(path: Path) -> bool:
    """True when the file's first record has a ``turns`` field (SPEED-Bench layout)."""
    _check_file(path)
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if ".parquet" in suffixes or ".pq" in suffixes:
        import pyarrow.parquet as pq

        try:
            return "turns" in pq.read_schema(path).names
        except Exception as error:
            raise DatasetError(f"{path}: cannot read Parquet file ({error})") from error
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetError(f"{path}:{line_number}: malformed JSON ({error.msg})") from error
                return isinstance(record, dict) and "turns" in record
    raise DatasetError(f"{path}: file has no records")


def load_dataset(spec: str, tokenizer: Any | None = None, **kwargs: Any) -> list[Request]:
    """Load a dataset by spec; fills ``isl`` when a tokenizer is given.

    Specs: ``embedded``, ``embedded:small``, ``speed-bench:PATH``, ``jsonl:PATH``, or a bare path
    (``.parquet`` / ``.jsonl`` / ``.json``; SPEED-Bench when records carry ``turns``). Extra keyword
    arguments go to the chosen builder or loader.
    """
    spec = spec.strip()
    if spec in ("embedded", "embedded:small"):
        options = dict(EMBEDDED_SMALL) if spec == "embedded:small" else {}
        if spec == "embedded:small":
            options["name"] = "embedded-small"
        options.update(kwargs)
        return build_embedded_dataset(tokenizer, **options)
    if spec.startswith("embedded:"):
        raise DatasetError(f"unknown embedded variant {spec!r}: use 'embedded' or 'embedded:small'")
    kind, _, rest = spec.partition(":")
    if kind in ("speed-bench", "jsonl") and rest:
        path = Path(rest)
        loader = load_speed_bench if kind == "speed-bench" else load_jsonl_prompts
        requests = loader(path, **kwargs)
    else:
        path = Path(spec)
        if path.suffix.lower() not in (".parquet", ".pq", ".jsonl", ".json", ".ndjson"):
            raise DatasetError(
                f"unknown dataset spec {spec!r}: use embedded, embedded:small, speed-bench:PATH, jsonl:PATH "
                "or a .parquet / .jsonl path"
            )
        loader = load_speed_bench if _looks_like_speed_bench(path) else load_jsonl_prompts
        requests = loader(path, **kwargs)
    return tokenize_requests(requests, tokenizer) if tokenizer is not None else requests


def list_datasets() -> list[dict[str, str]]:
    """The dataset specs ``load_dataset`` understands, for ``rift-ada datasets``."""
    return [
        {
            "name": "embedded",
            "description": (
                f"{EMBEDDED_DEFAULT_REQUESTS} prompts built from CPython's own stdlib sources (low-entropy "
                "code tier) and pydoc topics (high-entropy writing tier), ISL buckets 1K/2K/4K; answers "
                "walk through the input function by function / section by section. No download."
            ),
            "usage": "--dataset embedded",
        },
        {
            "name": "embedded:small",
            "description": (
                f"{EMBEDDED_SMALL['n_requests']} embedded prompts, ISL buckets 1K/2K, "
                f"max {EMBEDDED_SMALL['max_output_tokens']} output tokens (tests and demo)."
            ),
            "usage": "--dataset embedded:small",
        },
        {
            "name": "speed-bench:PATH",
            "description": (
                "SPEED-Bench prompts from a local Parquet or JSONL file (question_id, category, turns); "
                "tier from a tier/entropy column or 'low'/'high' in the file name."
            ),
            "usage": "--dataset speed-bench:/data/speed_bench_high_entropy.parquet",
        },
        {
            "name": "jsonl:PATH",
            "description": (
                'Plain prompts, one JSON object per line: {"id"?, "prompt" | "messages", "category"?, "tier"?}.'
            ),
            "usage": "--dataset jsonl:prompts.jsonl",
        },
    ]


def save_jsonl(requests: Iterable[Request], path: str | Path) -> Path:
    """Write requests as plain JSONL prompts (readable again by :func:`load_jsonl_prompts`)."""
    lines = []
    for request in requests:
        record = {
            "id": request.request_id,
            "dataset": request.dataset,
            "category": request.category,
            "tier": request.tier,
            "messages": request.prompt_messages,
            "max_output_tokens": request.max_output_tokens,
            "reference_response": request.reference_response,
        }
        lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    return atomic_write_text(path, "".join(lines))


__all__ = [
    "DEFAULT_ISL_BUCKETS",
    "DatasetError",
    "Request",
    "build_embedded_dataset",
    "count_prompt_tokens",
    "encode_prompt",
    "encode_text",
    "estimate_tokens",
    "list_datasets",
    "load_dataset",
    "load_jsonl_prompts",
    "load_speed_bench",
    "read_records",
    "save_jsonl",
    "tokenize_requests",
]
