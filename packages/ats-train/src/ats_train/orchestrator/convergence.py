"""When a run has converged: early_stop's judgement over the window-mean train losses."""

from __future__ import annotations


class ConvergenceDetector:
    """Converged when the best loss seen has not improved by more than `min_delta` (relative) over
    the last `patience` observations (early stopping as in Prechelt 1998, on a relative delta),
    and has not risen either: a loss climbing away from its best is diverging, not converged."""

    def __init__(self, min_delta: float, patience: int) -> None:
        if patience < 1:
            raise ValueError(f"ConvergenceDetector: patience = {patience} must be >= 1")
        self.min_delta = min_delta
        self.patience = patience

    def converged(self, losses: list[float]) -> bool:
        if len(losses) <= self.patience:
            return False
        best_before = min(losses[: -self.patience])
        recent = losses[-self.patience :]
        flat = max(recent) <= best_before * (1.0 + 3.0 * self.min_delta)
        return min(recent) > best_before * (1.0 - self.min_delta) and flat
