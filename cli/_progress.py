"""The one progress helper every command uses.

On a terminal (stderr is a TTY) it draws rich progress bars; anywhere else (SLURM or Kubernetes
logs, ``| tee``, CI) it prints one plain line per finished request or stage step, with the rate
and an ETA, so a log shows progress while the job runs instead of one bar at the end. Both go to
stderr, so ``--json`` output on stdout stays clean.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

StageFn = Callable[[str, int, "int | None"], None]  # (stage, done, total): calibrate and demo report this
RequestFn = Callable[[str, int], None]  # (request id, output tokens) after each finished request
TokensFn = Callable[[int, int], None]  # (tokens committed, rounds run) since the last call, as they happen


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass
class _Stage:
    name: str
    total: int | None
    unit: str
    start: float = field(default_factory=lambda: time.monotonic())
    done: int = 0
    tokens: int = 0
    rounds: int = 0
    live_tokens: bool = False  # tokens are reported as they are committed (`tokens_callback`), not per request
    last_line: float = -1.0
    last_done: int = -1
    last_tokens: int = -1
    task: Any = None

    def line(self, now: float) -> str:
        """``[collect probe] 3/10 requests (30%) | 0.52 requests/s | 120.3 tok/s | elapsed 6s | ETA 13s``."""
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        count = f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit}"
        if self.total:
            count += f" ({100 * self.done / self.total:.0f}%)"
        parts = [f"[{self.name}] {count}"]
        if self.live_tokens:
            parts.append(f"{self.tokens} tokens" + (f", {self.rounds} rounds" if self.rounds else ""))
        if elapsed >= 0.1:  # a rate over less time means nothing
            parts.append(f"{rate:.2f} {self.unit}/s")
        if self.tokens and elapsed >= 0.1:
            parts.append(f"{self.tokens / elapsed if elapsed > 0 else 0.0:.1f} tok/s")
        parts.append(f"elapsed {format_seconds(elapsed)}")
        if self.total and self.done < self.total and rate > 0:
            parts.append(f"ETA {format_seconds((self.total - self.done) / rate)}")
        elif self.total and self.done >= self.total:
            parts.append("done")
        return " | ".join(parts)


class ProgressReporter:
    """Progress of named stages: bars on a terminal, one log line per step elsewhere.

    ``min_interval`` throttles log lines of fast stages (a line at most this often, the last step
    always printed); 0 prints every step. ``token_interval`` throttles the lines that only committed
    tokens moved (a batched round every second would otherwise fill a log): at most one per stage this often.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        live: bool | None = None,
        min_interval: float = 0.5,
        token_interval: float = 15.0,
    ):
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal if live is None else live
        self.min_interval = min_interval
        self.token_interval = token_interval
        self._stages: dict[str, _Stage] = {}
        self._bars: RichProgress | None = None

    def __enter__(self) -> ProgressReporter:
        if self.live:
            self._bars = RichProgress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}", markup=False),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._bars.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bars is not None:
            self._bars.__exit__(kind, error, trace)
            self._bars = None

    def stage(self, name: str, total: int | None = None, unit: str = "steps") -> _Stage:
        """Start (or return) a named stage."""
        if name not in self._stages:
            stage = _Stage(name, total, unit)
            if self._bars is not None:
                stage.task = self._bars.add_task(name, total=total, rate="")
            self._stages[name] = stage
        return self._stages[name]

    def update(
        self, name: str, done: int, total: int | None = None, *, tokens: int = 0, rounds: int = 0, unit: str = "steps"
    ) -> None:
        """Set a stage's progress (creating it on first use) and report it."""
        stage = self.stage(name, total, unit)
        if total is not None:
            stage.total = total
        stage.done = done
        stage.tokens += tokens
        stage.rounds += rounds
        now = time.monotonic()
        if self._bars is not None:
            elapsed = now - stage.start
            rate = f"{stage.tokens / elapsed:.1f} tok/s" if stage.tokens and elapsed > 0 else ""
            if stage.live_tokens:
                rate = f"{stage.tokens} tok" + (f" {stage.rounds} rounds" if stage.rounds else "") + f" {rate}"
            self._bars.update(stage.task, completed=done, total=stage.total, rate=rate)
            return
        if done == stage.last_done and stage.tokens == stage.last_tokens:
            return  # nothing new (e.g. a final report repeating the last one)
        finished = stage.total is not None and done >= stage.total and done != stage.last_done
        interval = self.min_interval if done != stage.last_done else max(self.min_interval, self.token_interval)
        if finished or stage.last_line < 0 or now - stage.last_line >= interval:
            stage.last_line, stage.last_done, stage.last_tokens = now, done, stage.tokens
            self.console.print(Text(stage.line(now)))

    def log(self, message: str) -> None:
        """A message about the run (stderr, plain text, above any bars)."""
        self.console.print(Text(str(message)))

    def stage_callback(self) -> StageFn:
        """A ``(stage, done, total)`` callback (calibration, demo)."""

        def report(name: str, done: int, total: int | None) -> None:
            self.update(name, done, total)

        return report

    def request_callback(self, name: str, total: int | None) -> RequestFn:
        """A ``(request_id, n_tokens)`` callback advancing stage ``name`` by one request per call."""
        stage = self.stage(name, total, "requests")

        def finished(request_id: str, n_tokens: int) -> None:
            tokens = 0 if stage.live_tokens else int(n_tokens)
            self.update(name, stage.done + 1, total, tokens=tokens, unit="requests")

        return finished

    def tokens_callback(self, name: str, total: int | None = None) -> TokensFn:
        """A ``(tokens, rounds)`` callback adding committed tokens (and draft/verify rounds) to stage ``name``
        as a long stage commits them, so its line moves between finished requests (throttled like every
        line). The stage's request callback then counts requests only."""
        stage = self.stage(name, total, "requests")
        stage.live_tokens = True

        def committed(tokens: int, rounds: int = 0) -> None:
            self.update(name, stage.done, None, tokens=int(tokens), rounds=int(rounds), unit="requests")

        return committed

    def complete(self, name: str) -> None:
        """Mark a stage finished (e.g. every request was already done)."""
        stage = self.stage(name)
        if stage.total is not None and stage.done < stage.total:
            self.update(name, stage.total, stage.total)
