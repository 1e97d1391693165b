"""Tokenisation helpers shared with targets and collection: prompt encoding and token counts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from rift_ada.collectors.datasets.request import Request


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
