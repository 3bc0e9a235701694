"""[sft] [dpo] [grpo]: the knobs of each post-training objective (train.objective picks one).
Defaults follow TRL's trainers where TRL has the knob."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ats_train.config.choices import check_choices, require

DPOLoss = Literal["sigmoid", "ipo", "hinge"]
DPOReference = Literal["frozen", "precomputed"]
GRPOScale = Literal["group", "batch", "none"]
GRPOLoss = Literal["grpo", "dr_grpo"]


@dataclass(frozen=True)
class SFTSection:
    # several short examples per row of train.seq_len tokens, no attention across them
    # (document masking); false: one example per row, right-padded
    packing: bool = True


@dataclass(frozen=True)
class DPOSection:
    beta: float = 0.1
    loss: DPOLoss = "sigmoid"
    # frozen: a frozen copy of model.init_from scores every batch; precomputed: it scores every
    # pair once before training and is then freed
    reference: DPOReference = "frozen"

    def __post_init__(self) -> None:
        check_choices(self, "dpo")
        require(self.beta > 0.0, f"dpo.beta = {self.beta} must be > 0")


@dataclass(frozen=True)
class GRPOSection:
    group_size: int = 8  # completions per prompt (TRL num_generations)
    max_completion_tokens: int = 64
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    # shipped: exact_match, answer_format; or "package.module:function"
    rewards: tuple[str, ...] = ("exact_match",)
    reward_weights: tuple[float, ...] = ()  # empty: 1.0 each
    scale: GRPOScale = "group"  # advantages divided by the group's std, the batch's, or not
    loss_type: GRPOLoss = "grpo"
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: epsilon (DAPO sets it higher, e.g. 0.28)
    beta: float = 0.0  # KL to the reference; 0 (TRL's default) loads no reference model

    def __post_init__(self) -> None:
        check_choices(self, "grpo")
        # a TOML array arrives as a list
        object.__setattr__(self, "rewards", tuple(self.rewards))
        object.__setattr__(self, "reward_weights", tuple(float(w) for w in self.reward_weights))
        require(self.group_size >= 2, f"grpo.group_size = {self.group_size} must be >= 2")
        require(
            self.max_completion_tokens > 0,
            f"grpo.max_completion_tokens = {self.max_completion_tokens} must be > 0",
        )
        require(self.temperature > 0.0, f"grpo.temperature = {self.temperature} must be > 0")
        require(len(self.rewards) > 0, "grpo.rewards is empty; name at least one reward")
        require(
            not self.reward_weights or len(self.reward_weights) == len(self.rewards),
            f"grpo.reward_weights has {len(self.reward_weights)} values for "
            f"{len(self.rewards)} rewards",
        )
        require(0.0 < self.epsilon < 1.0, f"grpo.epsilon = {self.epsilon} must be in (0, 1)")
        if self.epsilon_high is None:
            object.__setattr__(self, "epsilon_high", self.epsilon)
        require(self.epsilon_high > 0.0, f"grpo.epsilon_high = {self.epsilon_high} must be > 0")
        require(self.beta >= 0.0, f"grpo.beta = {self.beta} must be >= 0")
