"""`rift-ada ray-launch --shards N -- collect ...`: one Ray task per shard on an existing Ray cluster."""

from __future__ import annotations

from typing import Annotated

import typer


def ray_launch(
    ctx: typer.Context,
    shards: Annotated[int, typer.Option(min=1, help="Number of shards (Ray tasks).")],
    num_gpus: Annotated[float, typer.Option(min=0, help="GPUs per shard task.")] = 1.0,
    num_cpus: Annotated[float, typer.Option(min=0, help="CPUs per shard task.")] = 1.0,
    max_retries: Annotated[int, typer.Option(min=0, help="Retries of a failed shard (it resumes).")] = 2,
    address: Annotated[str, typer.Option(help="Ray cluster address ('auto': the cluster of this node).")] = "auto",
) -> None:
    """Run `collect ...` or `targets ...` (the arguments after --) as N Ray tasks, one per shard."""
    from rift_ada.collectors.ray_launcher import launch, plan_shards

    try:
        plan_shards(ctx.args, shards)
        reports = launch(
            ctx.args, shards, num_gpus=num_gpus, num_cpus=num_cpus, max_retries=max_retries, address=address
        )
    except (ValueError, RuntimeError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=1) from None
    for report in reports:
        typer.echo(f"shard {report['shard']}: done on {report['host']}")


def register(app: typer.Typer) -> None:
    """Add the `ray-launch` command to the CLI."""
    app.command("ray-launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(ray_launch)


__all__ = ["register"]
