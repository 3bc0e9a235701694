"""TRL's own DPO and GRPO loss code as an outside oracle: TRL keeps both inline in its trainers'
_compute_loss methods (no standalone function), so they are called unbound on a namespace that
holds only what those methods read, with a stand-in model that returns given log-probs."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch
from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.grpo_trainer import GRPOTrainer


def _accelerator() -> SimpleNamespace:
    same = lambda t: t  # noqa: E731 - one process: gathers and reductions are the identity
    return SimpleNamespace(
        device=torch.device("cpu"), gather=same, gather_for_metrics=same,
        reduce=lambda t, reduction: t, sync_gradients=True, num_processes=1,
    )  # fmt: skip


def trl_dpo_loss(
    token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """token_logps (2P, T - 1): each position's log-prob of the next token, zero off the
    completion (TRL's batch is [chosen; rejected]); completion_mask (2P, T)."""
    rows, T = completion_mask.shape
    outputs = SimpleNamespace(
        log_probs=token_logps,
        entropy=torch.zeros(rows, T - 1, dtype=token_logps.dtype),
        mean_logits=torch.zeros(rows, T - 1, dtype=token_logps.dtype),
        is_top1=torch.zeros(rows, T - 1, dtype=torch.bool),
    )
    ns = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_accelerator(),
        aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=beta,
        label_smoothing=0.0, use_weighting=False, _total_train_tokens=0, _tp_size=1,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )  # fmt: skip
    inputs = {
        "input_ids": torch.zeros(rows, T, dtype=torch.long),
        "attention_mask": torch.ones(rows, T, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    loss = DPOTrainer._compute_loss(ns, lambda **_: outputs, inputs, False)
    return loss, dict(ns._metrics["train"])


def trl_grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float,
    epsilon_high: float,
    loss_type: str,
    beta: float,
    ref_logp: torch.Tensor | None,
    max_completion_length: int,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """TRL's loss and logged metrics for per-token log-probs (S, T) over the completion."""
    S, T = mask.shape
    ns = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=epsilon, epsilon_high=epsilon_high,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None), use_vllm=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length, _entropy_bonus_enabled=False,
        aux_loss_enabled=False, accelerator=_accelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )  # fmt: skip
    inputs = {
        "prompt_ids": torch.zeros(S, 1, dtype=torch.long),
        "prompt_mask": torch.ones(S, 1, dtype=torch.long),
        "completion_ids": torch.zeros(S, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old_logp,
    }
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    loss = GRPOTrainer._compute_loss(ns, None, inputs)
    return loss, dict(ns._metrics["train"])
