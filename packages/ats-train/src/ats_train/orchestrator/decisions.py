"""The decision log: run_dir/decisions.jsonl (one JSON object per decision, flushed as written) and
a line on the progress display. The checkpoint's trainer_state holds the same history; on resume
the file is rewritten from it, so file and checkpoint always tell one story.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

DECISIONS_FILE = "decisions.jsonl"


def read_decisions(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / DECISIONS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def describe(decision: dict[str, Any]) -> str:
    changes = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in decision["change"].items())
    verb = "did" if decision["applied"] else "advises"
    return (
        f"orchestrator step {decision['step']}: {decision['kind']} ({decision['reason']}; "
        f"confidence {decision['confidence']:.2f}) {verb}: {changes or decision['action']}"
    )


class DecisionLog:
    """Appends decisions to run_dir/decisions.jsonl (run_dir None: memory only) and shows them:
    every applied change, and a kind's advice at most once per `advice_every` steps."""

    def __init__(
        self, run_dir: Path | None, show: Callable[[str], None] | None, advice_every: int
    ) -> None:
        self.path = None if run_dir is None else Path(run_dir) / DECISIONS_FILE
        self.show = show
        self.advice_every = advice_every
        self._advised: dict[str, int] = {}  # kind -> step of the advice the display last showed

    def write(self, decision: dict[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(decision) + "\n")
        # advice repeats every cooldown while its condition holds (nothing acts on it): the
        # display shows it once per advice_every steps, the file keeps every one
        kind, step = decision["kind"], decision["step"]
        shown = self._advised.get(kind)
        repeat = not decision["applied"] and shown is not None and step - shown < self.advice_every
        if not decision["applied"] and not repeat:
            self._advised[kind] = step
        if self.show is not None and not repeat:
            self.show(describe(decision))

    def rewrite(self, history: list[dict[str, Any]]) -> None:
        """Replace the file with `history` (a resumed run's checkpointed decisions)."""
        if self.path is None:
            return
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(d) + "\n" for d in history))
        os.replace(tmp, self.path)
