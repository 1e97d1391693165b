"""Run `rift-ada collect` / `rift-ada targets` on an existing Ray cluster: one task per shard.

Each task runs the CLI as a subprocess with ``RIFT_ADA_SHARD="i/N"`` in its environment (the
command gets ``--shard auto``) and asks Ray for ``num_gpus`` GPUs, so Ray places one shard per
GPU. A shard that fails (non-zero exit, lost node) is retried: collection resumes from its
committed parts and the shard lease keeps two attempts from writing at once. Every node needs
the same environment (rift-ada installed, models cached) and the output directory on a file
system all nodes share. Needs the optional extra ``ray`` (``pip install 'rift-ada[ray]'``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rift_ada.collectors.cluster import SHARD_ENV

DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "rift_ada.cli.app")
SUBCOMMANDS = ("collect", "targets")


@dataclass(frozen=True)
class ShardTask:
    """One shard's command line and the environment it adds."""

    shard: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def plan_shards(cli_args: Sequence[str], n_shards: int, command: Sequence[str] = DEFAULT_COMMAND) -> list[ShardTask]:
    """The N tasks of a launch: ``command + cli_args + --shard auto`` with ``RIFT_ADA_SHARD=i/N``.

    ``cli_args`` starts with ``collect`` or ``targets`` and must not carry its own ``--shard``.
    """
    args = list(cli_args)
    if not args or args[0] not in SUBCOMMANDS:
        raise ValueError(f"ray launcher: the command must start with one of {list(SUBCOMMANDS)}, got {args[:1]}")
    if any(arg == "--shard" or arg.startswith("--shard=") for arg in args):
        raise ValueError("ray launcher: do not pass --shard; each task gets its own (--shard auto)")
    if n_shards < 1:
        raise ValueError(f"ray launcher: --shards must be >= 1, got {n_shards}")
    argv = (*command, *args, "--shard", "auto")
    return [ShardTask(f"{index}/{n_shards}", argv, {SHARD_ENV: f"{index}/{n_shards}"}) for index in range(n_shards)]


def run_task(task: ShardTask, extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run one shard's command here; raise on failure (so Ray retries it), else report where it ran."""
    env = {**os.environ, **(extra_env or {}), **task.env}
    result = subprocess.run(list(task.argv), env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"shard {task.shard} exited with {result.returncode} on {socket.gethostname()}: {result.stderr[-2000:]}"
        )
    return {"shard": task.shard, "host": socket.gethostname(), "pid": os.getpid(), "stdout": result.stdout[-2000:]}


def launch(
    cli_args: Sequence[str],
    n_shards: int,
    *,
    num_gpus: float = 1.0,
    num_cpus: float = 1.0,
    max_retries: int = 2,
    address: str | None = "auto",
    command: Sequence[str] = DEFAULT_COMMAND,
    extra_env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run every shard as a Ray task on the cluster at ``address`` (``"auto"``: the one this node is in).

    Returns one report per shard (shard, host, pid, stdout tail) in shard order; a shard that
    still fails after ``max_retries`` retries raises its error.
    """
    try:
        import ray
    except ImportError as error:
        raise RuntimeError("the Ray launcher needs Ray: pip install 'rift-ada[ray]'") from error
    tasks = plan_shards(cli_args, n_shards, command)
    if not ray.is_initialized():
        ray.init(address=address)
    remote = ray.remote(num_gpus=num_gpus, num_cpus=num_cpus, max_retries=max_retries, retry_exceptions=True)(run_task)
    return ray.get([remote.remote(task, dict(extra_env or {})) for task in tasks])


__all__ = ["ShardTask", "launch", "plan_shards", "run_task"]
