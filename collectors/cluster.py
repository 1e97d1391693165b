"""``--shard auto``: this process's shard from the environment of common cluster launchers.

Checked in this order (the first complete pair wins):

==========================  ===========================================  ==============================
launcher                    index                                        count
==========================  ===========================================  ==============================
explicit / Ray launcher     ``RIFT_ADA_SHARD="i/N"``                     (in the same variable)
SLURM job array             ``SLURM_ARRAY_TASK_ID`` - ``SLURM_ARRAY_TASK_MIN``  ``SLURM_ARRAY_TASK_COUNT``
Kubernetes Indexed Job      ``JOB_COMPLETION_INDEX``                     ``RIFT_ADA_NUM_SHARDS`` (set it to
                                                                         ``.spec.completions``)
torchrun / Ray Train        ``RANK``                                     ``WORLD_SIZE``
==========================  ===========================================  ==============================

Ray tasks started by :mod:`rift_ada.collectors.ray_launcher` get ``RIFT_ADA_SHARD``; Ray Train's
Torch workers get ``RANK``/``WORLD_SIZE``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SHARD_ENV = "RIFT_ADA_SHARD"
COUNT_ENV = "RIFT_ADA_NUM_SHARDS"
AUTO = "auto"


class ShardEnvError(ValueError):
    """``--shard auto`` found no (or an inconsistent) launcher environment; names the variables."""


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ShardEnvError(f"--shard auto: environment variable {name}={env[name]!r} is not an integer") from None


def shard_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(``"i/N"``, the variables it came from) for ``--shard auto``; raises when none are set."""
    env = os.environ if env is None else env
    if env.get(SHARD_ENV):
        return env[SHARD_ENV].strip(), SHARD_ENV
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = _int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
        index = _int(env, "SLURM_ARRAY_TASK_ID") - first
        return f"{index}/{_int(env, 'SLURM_ARRAY_TASK_COUNT')}", "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"
    if "JOB_COMPLETION_INDEX" in env:
        if COUNT_ENV not in env:
            raise ShardEnvError(
                f"--shard auto: JOB_COMPLETION_INDEX is set (Kubernetes Indexed Job) but {COUNT_ENV} is not; "
                "set it to the Job's .spec.completions"
            )
        return f"{_int(env, 'JOB_COMPLETION_INDEX')}/{_int(env, COUNT_ENV)}", f"JOB_COMPLETION_INDEX/{COUNT_ENV}"
    if "RANK" in env and "WORLD_SIZE" in env:
        return f"{_int(env, 'RANK')}/{_int(env, 'WORLD_SIZE')}", "RANK/WORLD_SIZE"
    raise ShardEnvError(
        f"--shard auto: no launcher environment found (looked for {SHARD_ENV}, SLURM_ARRAY_TASK_ID + "
        f"SLURM_ARRAY_TASK_COUNT, JOB_COMPLETION_INDEX + {COUNT_ENV}, RANK + WORLD_SIZE); give --shard i/N"
    )


def resolve_shard(shard: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """``shard`` unchanged, or the launcher's ``"i/N"`` when it is ``"auto"``."""
    if shard is None or shard.strip().lower() != AUTO:
        return shard
    return shard_from_env(env)[0]


__all__ = ["AUTO", "COUNT_ENV", "SHARD_ENV", "ShardEnvError", "resolve_shard", "shard_from_env"]
