"""One of rank_checks_runner.py's checks (test_expert_parallel.py reads it; also run alone on 4
ranks by expert_parallel_runner.py): a tiny MoE model with its experts sharded over EP groups of 2
ranks (expert_parallel = 2, each rank its own tokens) against the same model unsharded, run on
every rank's tokens in this one process (the single-process oracle).

Per rank: the forward (loss, aux losses, every MoE statistic) on its own tokens, and the gradients
after backward of its own loss: dense parameters get the gradient of that rank's loss; an expert
shard gets the sum over its EP group's losses (the all-to-all's backward brings the other rank's),
before reduce_expert_grads. Then DDP over the mean of all ranks' losses, the experts reduced apart
and everything clipped to half the norm: every gradient is half the oracle's mean gradient. The
results are max abs differences, gathered to rank 0.
"""

import copy
import dataclasses

import torch
import torch.distributed as dist
from ats_model import build_model, presets
from ats_train.backends.expert_parallel import (
    clip_grad_norm,
    reduce_expert_grads,
    shard_experts,
)
from torch.nn.parallel import DistributedDataParallel

EP = 2  # ranks per EP group


def _model(capacity_factor: float | None) -> torch.nn.Module:
    config = presets.get("tiny-moe")
    moe = dataclasses.replace(config.moe, capacity_factor=capacity_factor)
    torch.manual_seed(0)
    return build_model(dataclasses.replace(config, moe=moe), kernels="reference")


def _batches(vocab: int) -> list[torch.Tensor]:
    """Rank r's tokens: every rank can make every rank's (the oracle runs them all)."""
    return [
        torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(100 + r))
        for r in range(dist.get_world_size())
    ]


def _loss(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    out = model(x, targets=x.roll(-1, dims=1))
    loss = out.loss + 0.01 * out.aux["moe_lb"] + 0.001 * out.aux["moe_z"]
    values = {"loss": out.loss, **out.aux, **out.stats}
    return loss, {k: v.detach().float() for k, v in values.items()}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) if a.numel() else 0.0


def _local(full: torch.Tensor, name: str, rank: int, experts: set[str]) -> torch.Tensor:
    """The oracle's tensor as this rank holds it: experts r*E/N.. of an expert weight, r = the
    rank's place in its EP group."""
    if name not in experts:
        return full
    n_local, place = full.shape[0] // EP, rank % EP
    return full[place * n_local : (place + 1) * n_local]


def _gathered(value: object) -> list:
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def check(capacity_factor: float | None) -> dict[str, object]:
    rank = dist.get_rank()
    oracle = _model(capacity_factor)
    model = copy.deepcopy(oracle)
    ep, names, _ = shard_experts(model, EP)
    experts = set(names)
    batches = _batches(oracle.config.vocab_size)

    # forward and backward of this rank's loss
    loss, values = _loss(model, batches[rank])
    loss.backward()
    oracle_losses, oracle_values, oracle_grads = [], [], []
    for x in batches:
        oracle.zero_grad()
        oracle_loss, want = _loss(oracle, x)
        oracle_loss.backward()
        oracle_losses.append(oracle_loss.detach())
        oracle_values.append(want)
        oracle_grads.append({n: p.grad.clone() for n, p in oracle.named_parameters()})
    forward = {k: _max_diff(v, oracle_values[rank][k]) for k, v in values.items()}
    group = range(rank - rank % EP, rank - rank % EP + EP)  # my EP group's ranks
    grads = {}
    for name, p in model.named_parameters():
        want = (
            sum(oracle_grads[r][name] for r in group)
            if name in experts
            else oracle_grads[rank][name]
        )
        grads[name] = _max_diff(p.grad, _local(want, name, rank, experts))

    # one DDP step of the mean loss, experts reduced apart from DDP; clipped to half the norm
    model.zero_grad()
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, sorted(experts))
    ddp = DistributedDataParallel(model, broadcast_buffers=False)
    loss, _ = _loss(ddp, batches[rank])
    loss.backward()
    params = dict(model.named_parameters())
    expert_params = [params[n] for n in sorted(experts)]
    reduce_expert_grads(expert_params, ep)
    dense = [p for n, p in params.items() if n not in experts]
    want_grads = {n: sum(g[n] for g in oracle_grads) / len(oracle_grads) for n in params}
    want_norm = torch.sqrt(sum(g.pow(2).sum() for g in want_grads.values()))
    norm = clip_grad_norm(dense, expert_params, float(want_norm) / 2, ep)
    step_grads = {
        n: _max_diff(p.grad, _local(want_grads[n] * 0.5, n, rank, experts))
        for n, p in params.items()
    }
    return {
        "forward": _gathered(forward),
        "grads": _gathered(grads),
        "step_grads": _gathered(step_grads),
        "norm": [float(norm), float(want_norm)],
        "losses_differ": float(torch.stack(oracle_losses).std()),
        "replica_groups": ep.replicas is not None,
        "local_experts": [layer.experts.w1.shape[0] for layer in model.moe_layers()],
        "dropped": [float(v["moe/dropped_fraction"].max()) for v in oracle_values],
    }
