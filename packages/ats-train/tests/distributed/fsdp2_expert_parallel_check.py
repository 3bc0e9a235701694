"""One of rank_checks_runner.py's checks (test_expert_parallel.py reads it; also run on 4 ranks by
expert_parallel_runner.py): the fsdp2 backend with parallel.expert_parallel = 2 (expert shards
outside FSDP2, the rest sharded over every rank) against the unsharded model run on every rank's
tokens in this one process (the single-process oracle).

Per rank: the forward (loss, aux losses, every MoE statistic) on its own tokens; then the backend's
step (expert gradients summed over their replicas, the global norm, the clip) with SGD at lr 1 and
grad_clip half the oracle's norm of the mean gradient: every weight must move by half the oracle's
mean gradient, the experts' on their holders, the rest in FSDP2's gathered full tensors.
"""

import copy
import dataclasses

import torch
import torch.distributed as dist
from ats_model import build_model, presets
from ats_train.backends import build_backend
from ats_train.backends.expert_parallel import expert_parameter_names
from ats_train.config import ParallelSection
from ats_train.precision import build_precision
from expert_parallel_check import EP, _batches, _gathered, _local, _loss, _max_diff
from torch.distributed.tensor import DTensor


def check(capacity_factor: float | None) -> dict[str, object]:
    device = torch.device("cpu")
    parallel = ParallelSection(backend="fsdp2", expert_parallel=EP)
    backend = build_backend(parallel, device, build_precision("fp32", device))
    config = presets.get("tiny-moe")
    torch.manual_seed(0)
    moe = dataclasses.replace(config.moe, capacity_factor=capacity_factor)
    oracle = build_model(dataclasses.replace(config, moe=moe), kernels="reference")
    raw = copy.deepcopy(oracle)
    backend.shard_experts(raw)
    experts = set(expert_parameter_names(raw))
    optimizer = torch.optim.SGD(raw.parameters(), lr=1.0)
    model, optimizer = backend.wrap(raw, optimizer)
    rank = dist.get_rank()
    batches = _batches(oracle.config.vocab_size)

    loss, values = _loss(model, batches[rank])
    loss.backward()
    oracle_values, oracle_grads = [], []
    for x in batches:
        oracle.zero_grad()
        oracle_loss, want = _loss(oracle, x)
        oracle_loss.backward()
        oracle_values.append(want)
        oracle_grads.append({n: p.grad.clone() for n, p in oracle.named_parameters()})
    forward = {k: _max_diff(v, oracle_values[rank][k]) for k, v in values.items()}

    want_grads = {n: sum(g[n] for g in oracle_grads) / len(oracle_grads) for n in oracle_grads[0]}
    want_norm = torch.sqrt(sum(g.pow(2).sum() for g in want_grads.values()))
    norm, stepped = backend.step(optimizer, grad_clip=float(want_norm) / 2)
    before = dict(oracle.named_parameters())
    moved = {}
    for name, p in model.named_parameters():
        now = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        start = _local(before[name].detach(), name, rank, experts)
        want = _local(want_grads[name] * 0.5, name, rank, experts)
        moved[name] = _max_diff(start - now, want)
    return {
        "forward": _gathered(forward),
        "moved": _gathered(moved),
        "norm": [norm, float(want_norm)],
        "stepped": stepped,
        "sharded": sorted(n for n, p in model.named_parameters() if isinstance(p, DTensor)),
        "experts": sorted(experts),
        "local_experts": [layer.experts.w1.shape[0] for layer in model.moe_layers()],
        "dropped": [float(v["moe/dropped_fraction"].max()) for v in oracle_values],
    }
