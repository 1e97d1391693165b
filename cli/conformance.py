"""`rift-ada conformance`: write conformance vectors, run the reference, check a port's output."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console()
conformance_app = typer.Typer(
    help="Conformance vectors that prove a port of rift_ada.Controller decides alike (docs/serving.md).",
    no_args_is_help=True,
)


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code=2)


@conformance_app.command("write")
def write(
    controllers: Annotated[
        list[Path] | None,
        typer.Argument(help="Controller JSON files (default: every data/controllers/*.json)."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the vector files.")] = Path("data/conformance"),
    seed: Annotated[int, typer.Option(help="Seed of every random choice (recorded in manifest.json).")] = 0,
    random_controllers: Annotated[int, typer.Option("--random", help="Randomised controllers to add.")] = 6,
    cases: Annotated[int, typer.Option(help="Cases (requests) per controller.")] = 4,
    rounds: Annotated[int, typer.Option(help="Verification rounds per case.")] = 96,
) -> None:
    """Write vectors for controller files and randomised controllers (deterministic in --seed)."""
    from rift_ada.calibrate.export import atomic_write_text
    from rift_ada.conformance import vector_set
    from rift_ada.controller import ControllerError

    paths = controllers if controllers else sorted(Path("data/controllers").glob("*.json"))
    if cases < 1 or rounds < 1 or random_controllers < 0:
        _fail("--cases and --rounds must be >= 1, --random >= 0")
    try:
        files = vector_set(paths, seed=seed, n_random=random_controllers, n_cases=cases, n_rounds=rounds)
    except ControllerError as error:
        _fail(str(error))
    for name, text in files.items():
        atomic_write_text(out / name, text)
    console.print(f"wrote {len(files)} files to [bold]{out}[/bold]")


@conformance_app.command("run")
def run(
    vectors: Annotated[Path, typer.Argument(help="A vectors file (.jsonl).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file in the port format.")],
) -> None:
    """Run rift_ada.Controller (the reference port) on a vectors file and write its output."""
    from rift_ada.calibrate.export import atomic_write_text
    from rift_ada.conformance import ConformanceError, run_vectors
    from rift_ada.controller import ControllerError

    try:
        atomic_write_text(out, run_vectors(vectors))
    except (ConformanceError, ControllerError) as error:
        _fail(str(error))
    console.print(f"wrote [bold]{out}[/bold]")


@conformance_app.command("check")
def check(
    vectors: Annotated[Path, typer.Argument(help="A vectors file (.jsonl).")],
    output: Annotated[Path, typer.Argument(help="The port's output file (.jsonl).")],
) -> None:
    """Compare a port's output with the vectors; exit 1 naming the first differing round."""
    from rift_ada.conformance import ConformanceError, check_output
    from rift_ada.controller import ControllerError

    try:
        result = check_output(vectors, output)
    except (ConformanceError, ControllerError) as error:
        _fail(str(error))
    if not result.ok:
        console.print(f"[red]FAIL[/red] {output}: {result.first_difference} ({result.rounds_checked} rounds matched)")
        raise typer.Exit(code=1)
    console.print(f"[green]OK[/green] {output}: {result.rounds_checked} rounds match {vectors}")


def register(app: typer.Typer) -> None:
    """Add the `conformance` command group to the rift-ada app."""
    app.add_typer(conformance_app, name="conformance")
