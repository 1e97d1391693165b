"""`rift-ada conformance`: write conformance vectors, run the reference, check a port's output.

Follows docs/cli.md: bad options exit 2 before any work, runtime errors (a bad vectors or output
file, an invalid controller, an unwritable ``--out``) are one ``error: ...`` line on stderr with
exit 1, and ``--json`` prints one JSON document on stdout (messages then go to stderr).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from rift_ada.cli._common import check_writable  # the one output-path check
from rift_ada.cli._errors import fail

console = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)
conformance_app = typer.Typer(
    help="Conformance vectors that prove a port of rift_ada.Controller decides alike (docs/serving.md).",
    no_args_is_help=True,
)
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of text.")]


def _say(json_output: bool, *parts: tuple[str, str | None]) -> None:
    """A message as plain text (paths are never markup): stdout, or stderr under ``--json``."""
    text = Text()
    for part, style in parts:
        text.append(part, style=style)
    (stderr if json_output else console).print(text)


def _emit(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


@conformance_app.command("write")
def write(
    controllers: Annotated[
        list[Path] | None,
        typer.Argument(help="Controller JSON files (default: every data/controllers/*.json)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the vector files.")] = Path("data/conformance"),
    seed: Annotated[int, typer.Option(help="Seed of every random choice (recorded in manifest.json).")] = 0,
    random_controllers: Annotated[int, typer.Option("--random", min=0, help="Randomised controllers to add.")] = 6,
    cases: Annotated[int, typer.Option(min=1, help="Cases (requests) per controller.")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="Verification rounds per case.")] = 96,
    json_output: JsonOption = False,
) -> None:
    """Write vectors for controller files and randomised controllers (deterministic in --seed)."""
    from rift_ada.atomic import atomic_write_text
    from rift_ada.conformance import ConformanceError, vector_set
    from rift_ada.controller import ControllerError

    paths = controllers if controllers else sorted(Path("data/controllers").glob("*.json"))
    check_writable(out / "manifest.json", "--out")
    try:
        files = vector_set(paths, seed=seed, n_random=random_controllers, n_cases=cases, n_rounds=rounds)
    except (ConformanceError, ControllerError, OSError) as error:
        fail(error)
    for name, text in files.items():
        atomic_write_text(out / name, text)
    if json_output:
        _emit({"out": str(out), "files": sorted(files), "seed": seed})
    else:
        _say(False, (f"wrote {len(files)} files to ", None), (str(out), "bold"))


@conformance_app.command("run")
def run(
    vectors: Annotated[Path, typer.Argument(help="A vectors file (.jsonl).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file in the port format.")],
    json_output: JsonOption = False,
) -> None:
    """Run rift_ada.Controller (the reference port) on a vectors file and write its output."""
    from rift_ada.atomic import atomic_write_text
    from rift_ada.conformance import ConformanceError, run_vectors
    from rift_ada.controller import ControllerError

    check_writable(out, "--out")
    try:
        text = run_vectors(vectors)
    except (ConformanceError, ControllerError, OSError) as error:
        fail(error)
    atomic_write_text(out, text)
    if json_output:
        _emit({"vectors": str(vectors), "out": str(out), "rounds": text.count("\n") - 1})
    else:
        _say(False, ("wrote ", None), (str(out), "bold"))


@conformance_app.command("check")
def check(
    vectors: Annotated[Path, typer.Argument(help="A vectors file (.jsonl).")],
    output: Annotated[Path, typer.Argument(help="The port's output file (.jsonl).")],
    json_output: JsonOption = False,
) -> None:
    """Compare a port's output with the vectors; exit 1 naming the first differing round."""
    from rift_ada.conformance import ConformanceError, check_output
    from rift_ada.controller import ControllerError

    try:
        result = check_output(vectors, output)
    except (ConformanceError, ControllerError, OSError) as error:
        fail(error)
    if json_output:
        _emit(
            {
                "vectors": str(vectors),
                "output": str(output),
                "ok": result.ok,
                "rounds_checked": result.rounds_checked,
                "first_difference": result.first_difference,
            }
        )
    elif result.ok:
        _say(False, ("OK", "green"), (f" {output}: {result.rounds_checked} rounds match {vectors}", None))
    else:
        _say(
            False,
            ("FAIL", "red"),
            (f" {output}: {result.first_difference} ({result.rounds_checked} rounds matched)", None),
        )
    if not result.ok:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    """Add the `conformance` command group to the rift-ada app."""
    app.add_typer(conformance_app, name="conformance")
