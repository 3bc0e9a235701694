"""GRPO: G completions per prompt sampled with the policy's KV cache (ats_model.generate, batched,
on the training device), scored by the configured reward functions, turned into group-normalised
advantages, and trained with the clipped objective of grpo_loss.py; the MoE aux losses of the
policy forward are kept. One optimisation step per generation (TRL's num_iterations = 1), so the
old policy is the current one: the ratio is 1 in value and the clip bounds it for the gradient."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from ats_model import generate
from ats_tokenizer import Tokenizer
from torch import nn

from ats_train.objectives.examples import Prompt
from ats_train.objectives.grpo_loss import group_advantages, grpo_loss
from ats_train.objectives.logprobs import forward_logprobs, shifted_labels
from ats_train.objectives.reference import Reference
from ats_train.objectives.rewards import RewardFn, score
from ats_train.objectives.rows import Rows
from ats_train.objectives.sft import LossParts


@dataclass
class Sampling:
    group_size: int
    max_completion_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    rank: int


@dataclass
class Rollout:
    ids: torch.Tensor  # (S, Tp + Tc) prompt (left-padded) + completion
    attention_mask: torch.Tensor  # (S, Tp + Tc)
    completion_mask: torch.Tensor  # (S, Tc): 1 up to and including the stop token
    prompt_len: int  # Tp
    texts: list[str]  # decoded completions (stop token excluded)


def rollout(
    model: nn.Module,
    tok: Tokenizer,
    ids: torch.Tensor,
    mask: torch.Tensor,
    stops: tuple[int, ...],
    sampling: Sampling,
    seed: int | None,
    greedy: bool = False,
) -> Rollout:
    """G completions of each of B left-padded prompts (B, Tp) -> a Rollout of S = B * G rows."""
    G = 1 if greedy else sampling.group_size
    ids, mask = ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0)  # (S, Tp)
    Tp = ids.shape[1]
    out = generate(
        model,
        ids,
        sampling.max_completion_tokens,
        attention_mask=mask,
        temperature=0.0 if greedy else sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        stop_tokens=stops,
        seed=seed,
        pad_token_id=tok.eos_id,
    )
    completion = out[:, Tp:]  # (S, Tc)
    is_stop = torch.isin(completion, torch.tensor(stops, device=completion.device))
    # 1 up to and including the first stop token: stops before a position, counted exclusively
    before = is_stop.long().cumsum(dim=1) - is_stop.long()
    completion_mask = (before == 0).long()  # (S, Tc)
    texts = []
    for row, keep in zip(completion.tolist(), completion_mask.tolist(), strict=True):
        kept = [t for t, k in zip(row, keep, strict=True) if k and t not in stops]
        texts.append(tok.decode(kept))
    full_mask = torch.cat([mask, completion_mask], dim=1)
    return Rollout(out, full_mask, completion_mask, Tp, texts)


class GRPOObjective:
    name = "grpo"
    loss_tracks_progress = False

    def __init__(
        self,
        *,
        raw_model: nn.Module,
        tokenizer: Tokenizer,
        prompts: list[Prompt],
        rewards: dict[str, RewardFn],
        weights: list[float],
        sampling: Sampling,
        scale: str,
        loss_type: str,
        epsilon: float,
        epsilon_high: float,
        beta: float,
        reference: Reference | None,
        stops: tuple[int, ...],
        val_index: list[int],
    ) -> None:
        self.raw_model, self.tok, self.prompts = raw_model, tokenizer, prompts
        self.rewards, self.weights, self.sampling = rewards, weights, sampling
        self.scale, self.loss_type = scale, loss_type
        self.epsilon, self.epsilon_high, self.beta = epsilon, epsilon_high, beta
        self.reference, self.stops, self.val_index = reference, stops, val_index
        self._micro = (-1, 0)  # (step, micro-batch within it): the sampling seed

    def _seed(self, step: int) -> int:
        last, micro = self._micro
        self._micro = (step, micro + 1 if last == step else 0)
        key = f"{self.sampling.seed}:{step}:{self.sampling.rank}:{self._micro[1]}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:7], "little")

    def score(self, rows: list[int], texts: list[str], G: int) -> dict[str, torch.Tensor]:
        """Each reward function's values (S,) on the completions of prompts `rows`."""
        prompts = [self.prompts[r] for r in rows for _ in range(G)]
        names = sorted({k for p in prompts for k in p.columns})
        columns = {k: [p.columns.get(k) for p in prompts] for k in names}
        texts_in = [p.text for p in prompts]
        return {
            name: torch.tensor(score(name, fn, texts_in, texts, columns), dtype=torch.float64)
            for name, fn in self.rewards.items()
        }

    def losses(self, model: nn.Module, x: Rows, y: Rows, step: int) -> LossParts:
        G = self.sampling.group_size
        roll = rollout(
            self.raw_model, self.tok, x["ids"], x["attention_mask"], self.stops, self.sampling,
            self._seed(step),
        )  # fmt: skip
        per_fn = self.score(y["row"].tolist(), roll.texts, G)
        total = sum(w * r for w, r in zip(self.weights, per_fn.values(), strict=True))
        device = roll.ids.device
        advantages = group_advantages(total, G, self.scale).to(device)  # (S,)
        loss_mask = torch.cat([torch.zeros_like(x["attention_mask"]).repeat_interleave(G, 0),
                               roll.completion_mask], dim=1)  # fmt: skip
        labels = shifted_labels(roll.ids, loss_mask)  # (S, Tp + Tc)
        token_logps, aux, stats = forward_logprobs(model, roll.ids, roll.attention_mask, labels)
        Tp, Tc = roll.prompt_len, roll.completion_mask.shape[1]
        window = slice(Tp - 1, Tp - 1 + Tc)  # the positions that predict completion tokens
        logp = token_logps[:, window]  # (S, Tc)
        ref = None
        if self.beta != 0.0:
            ref = self.reference.token_logprobs(roll.ids, roll.attention_mask, labels)[:, window]
        terms = grpo_loss(
            logp, logp.detach(), advantages.to(logp.dtype), roll.completion_mask,
            epsilon=self.epsilon, epsilon_high=self.epsilon_high, loss_type=self.loss_type,
            beta=self.beta, ref_logp=ref, max_completion_length=self.sampling.max_completion_tokens,
        )  # fmt: skip
        grouped = total.view(-1, G)
        metrics = {
            "reward": total.mean(),
            "reward_std": grouped.std(dim=1).mean()
            if G > 1
            else torch.zeros((), dtype=total.dtype),
            "completions/mean_length": roll.completion_mask.sum(dim=1).double().mean().cpu(),
            "clip_ratio/region_mean": terms.clip_ratio.double().cpu(),
            "kl": terms.kl.double().cpu(),
        }
        for name, values in per_fn.items():
            metrics[f"rewards/{name}/mean"] = values.mean()
            metrics[f"rewards/{name}/std"] = values.std() if len(values) > 1 else values.mean() * 0
        metrics = {k: v.to(device=device, dtype=torch.float32) for k, v in metrics.items()}
        return terms.loss, aux, {**stats, **metrics}

    @torch.no_grad()
    def evaluate(self, run: Any) -> dict[str, float]:
        """Greedy completions of this rank's val prompts: mean weighted reward ("loss" = minus it)."""
        device = run.backend.device
        sums = torch.zeros(2, dtype=torch.float64)
        chunk = 32
        for i in range(0, len(self.val_index), chunk):
            rows = self.val_index[i : i + chunk]
            prompts = [self.prompts[r] for r in rows]
            width = max(len(p.ids) for p in prompts)
            ids = torch.full((len(rows), width), self.tok.eos_id)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for b, p in enumerate(prompts):
                ids[b, width - len(p.ids) :], mask[b, width - len(p.ids) :] = torch.tensor(p.ids), 1
            with run.forward_context():
                roll = rollout(self.raw_model, self.tok, ids.to(device), mask.to(device),
                               self.stops, self.sampling, None, greedy=True)  # fmt: skip
            per_fn = self.score(rows, roll.texts, 1)
            total = sum(w * r for w, r in zip(self.weights, per_fn.values(), strict=True))
            sums += torch.tensor([float(total.sum()), len(rows)], dtype=torch.float64)
        reward, n = run.backend.all_reduce_mean_tensor(sums).tolist()
        mean = reward / max(n, 1e-12)
        return {"loss": -mean, "reward": mean}
