"""Markdown CLI reference generated from the Typer app (README and docs/cli.md embed it)."""

from __future__ import annotations

from typing import Any

import typer


def _option_line(parameter: Any) -> str:
    names = ", ".join(f"`{name}`" for name in parameter.opts)
    if getattr(parameter, "param_type_name", "") == "argument":
        return f"- {names} (argument)"
    help_text = getattr(parameter, "help", None) or ""
    default = parameter.default
    hidden = default is None or default is False or default == () or callable(default)
    shown_default = "" if hidden else f" (default: `{default}`)"
    required = " **required**" if parameter.required else ""
    text = f": {help_text}" if help_text else ""
    return f"- {names}{required}{text}{shown_default}"


def cli_reference() -> str:
    """One section per command: its help line and its options."""
    from rift_ada.cli.app import app

    group = typer.main.get_command(app)
    lines = []
    for name, command in sorted(group.commands.items()):  # type: ignore[attr-defined]
        lines += [f"#### `rift-ada {name}`", "", (command.help or "").strip().splitlines()[0], ""]
        options = [p for p in command.params if p.name != "help"]
        lines += [_option_line(parameter) for parameter in options] or ["- (no options)"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def update_readme(path: str = "README.md") -> None:
    """Replace the README's CLI reference (between the cli markers) with the current one."""
    from pathlib import Path

    readme = Path(path)
    text = readme.read_text()
    start, end = "<!-- cli:start -->\n", "<!-- cli:end -->"
    head, rest = text.split(start, 1)
    readme.write_text(head + start + cli_reference() + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    import sys

    if "--readme" in sys.argv:
        update_readme()
    else:
        print(cli_reference(), end="")
