"""Chinchilla budgeting (Hoffmann et al. 2022, arXiv:2203.15556): tokens per parameter, the
compute-optimal model size for a FLOP budget, and the steps a token budget needs.

Training compute C = 6 N D (N parameters, D tokens). Two laws:
- "approach1" (default): N_opt = G * C^0.5, D_opt = C / (6 N_opt), the paper's approach 1
  exponents (a = b = 0.5). G = 0.0909 is fitted to the paper's Table 3 (400M params at 1.92e19
  FLOPs, 1B at 1.21e20, 10B at 1.23e22), which implies D / N = 1 / (6 G^2) ~ 20 tokens per
  parameter at every scale.
- "parametric": approach 3, L(N, D) = E + A / N^alpha + B / D^beta with E = 1.69, A = 406.4,
  B = 410.7, alpha = 0.34, beta = 0.28; minimizing L under C = 6 N D gives
  N_opt = G (C/6)^(beta/(alpha+beta)), G = (alpha A / (beta B))^(1/(alpha+beta)) (paper eq. 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ats_train.errors import ConfigError

TOKENS_PER_PARAM = 20.0
APPROACH1_G = 0.0909  # N_opt = G * sqrt(C), fitted to Table 3 (see the module docstring)
# approach 3 parametric fit (paper section 3.3)
E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28


@dataclass(frozen=True)
class Plan:
    flops: float
    law: str
    params: float  # compute-optimal N
    tokens: float  # compute-optimal D
    loss: float  # the parametric fit's predicted loss at (N, D), nats

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params


def parametric_loss(params: float, tokens: float) -> float:
    return E + A / params**ALPHA + B / tokens**BETA


def compute_optimal(flops: float, law: str = "approach1") -> Plan:
    """N_opt, D_opt for a training budget of `flops` FLOPs under `law`."""
    if not flops > 0:
        raise ValueError(f"compute_optimal: flops = {flops} must be > 0")
    if law == "approach1":
        params = APPROACH1_G * math.sqrt(flops)
    elif law == "parametric":
        g = (ALPHA * A / (BETA * B)) ** (1.0 / (ALPHA + BETA))
        params = g * (flops / 6.0) ** (BETA / (ALPHA + BETA))
    else:
        raise ValueError(f"compute_optimal: law = {law!r}, expected 'approach1' or 'parametric'")
    tokens = flops / (6.0 * params)
    return Plan(flops, law, params, tokens, parametric_loss(params, tokens))


def token_budget(params: float, tokens_per_param: float = TOKENS_PER_PARAM) -> float:
    """Compute-optimal training tokens for a model of `params` parameters (about 20 per param)."""
    if not params > 0 or not tokens_per_param > 0:
        raise ValueError(
            f"token_budget: params = {params} and tokens_per_param = {tokens_per_param} must be > 0"
        )
    return params * tokens_per_param


def steps_for_tokens(tokens: float, batch_size: int, seq_len: int) -> int:
    return max(1, math.ceil(tokens / (batch_size * seq_len)))


def describe(plan: Plan) -> list[str]:
    """The lines `ats-train plan` prints."""
    return [
        f"compute budget      {plan.flops:.3g} FLOPs (C = 6 N D)",
        f"law                 {plan.law}",
        f"compute-optimal N   {plan.params:.4g} parameters",
        f"compute-optimal D   {plan.tokens:.4g} tokens",
        f"tokens / parameter  {plan.tokens_per_param:.1f}",
        f"predicted loss      {plan.loss:.3f} nats (parametric fit)",
    ]


def run_steps(
    steps_from: str,
    configured_steps: int,
    *,
    tokens_per_param: float,
    flops: float | None,
    active_params: float,
    flops_per_token: float,
    batch_size: int,
    seq_len: int,
) -> int:
    """train.steps for [plan] steps_from: "config" (as given), "tokens_per_param" (D = that x the
    active parameters: compute per token follows the active ones), "flops" (D = flops / the
    model's training FLOPs per token)."""
    if steps_from == "config":
        return configured_steps
    if steps_from == "tokens_per_param":
        tokens = token_budget(active_params, tokens_per_param)
    elif steps_from == "flops":
        if flops is None:
            raise ConfigError("plan.steps_from = 'flops' needs plan.flops")
        tokens = flops / flops_per_token
    else:
        raise ConfigError(
            f"plan.steps_from = {steps_from!r} is not config, tokens_per_param, flops"
        )
    return steps_for_tokens(tokens, batch_size, seq_len)
