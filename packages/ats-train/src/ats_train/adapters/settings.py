"""TrainConfig [lora]: the LoRA adapter a run with train.trainable = "lora" trains (ats_model
adapters.LoRAConfig checks the values when the run is built). No torch here: the config package
imports this module before any input is validated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRASection:
    rank: int = 8
    alpha: float = 16.0  # the update is scaled by alpha / rank
    dropout: float = 0.0  # on the adapter input of linear targets; must be 0 with expert targets
    # projection names: wq wk wv wo (attention), w1 w3 w2 (FFN, shared and grouped experts), router
    targets: tuple[str, ...] = ("wq", "wk", "wv", "wo")

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))  # a TOML array arrives as a list
