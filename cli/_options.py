"""Options shared by several commands."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from rift_ada.scorers.registry import DEFAULT_SCORER, SCORER_NAMES

ModelOption = Annotated[str, typer.Option("--model", "-m", help="Preset name, local directory or Hub id.")]
ScorerName = Literal[SCORER_NAMES]  # type: ignore[valid-type]  # the registry's names, as choices
ScorerOption = Annotated[
    ScorerName,
    typer.Option(help="Prefill scorer of the SnapKV baseline and RIFT-stat/dyn/ada selections (docs/selectors.md)."),
]
__all__ = ["DEFAULT_SCORER", "SCORER_NAMES", "ModelOption", "ScorerOption"]
