"""The README's code example runs, and its CLI reference matches the Typer app."""

from __future__ import annotations

import re
from pathlib import Path

from rift_ada.cli.reference import cli_reference

README = Path(__file__).resolve().parent.parent / "README.md"


def _section(start: str, end: str) -> str:
    text = README.read_text()
    return text[text.index(start) + len(start) : text.index(end)]


def test_readme_example_runs(capsys, monkeypatch):
    monkeypatch.chdir(README.parent)
    block = re.search(r"```python\n(.*?)```", _section("<!-- example:start -->", "<!-- example:end -->"), re.S)
    exec(compile(block.group(1), "README example", "exec"), {"__name__": "readme_example"})
    printed = capsys.readouterr().out
    assert "refresh at" in printed  # the session refreshed when acceptance collapsed
    match = re.search(r"AL (\d+\.\d+) over (\d+) rounds, (\d+) refreshes", printed)
    assert match and 1.0 <= float(match.group(1)) <= 12.0


def test_readme_cli_reference_is_current():
    assert _section("<!-- cli:start -->\n", "<!-- cli:end -->") == cli_reference()
