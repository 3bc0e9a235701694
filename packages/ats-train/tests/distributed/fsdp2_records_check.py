"""One of rank_checks_runner.py's checks (test_fsdp2_records.py reads it): a tiny hybrid model
(2 MoE layers, 1 MoD layer), sharded per block by the fsdp2 backend, against an unsharded copy in
the same process, with or without activation checkpointing applied before sharding.

Every rank feeds the same batch, so the averaged sharded gradient equals the copy's gradient.
The result, for 2 steps: both models' loss and aux losses, the number of per-layer stats rows, and
the largest |gradient difference| over all parameters (sharded grads gathered).
"""

import copy

import torch
from ats_train.training_wrappers import apply_activation_checkpointing
from fsdp2_cpu_setup import cpu_fsdp2
from torch.distributed.tensor import DTensor

AUX_WEIGHT = 0.01  # every aux loss in the objective, so the records' gradients are checked too


def summary(out) -> dict:  # noqa: ANN001
    return {
        "loss": out.loss.item(),
        "aux": {k: v.item() for k, v in out.aux.items()},
        "stats_rows": {k: v.shape[0] for k, v in out.stats.items()},
    }


def check(checkpointing: bool) -> dict:
    backend, config, raw = cpu_fsdp2("tiny-hybrid")
    reference = copy.deepcopy(raw)
    if checkpointing:
        apply_activation_checkpointing(raw)
    optimizer = torch.optim.SGD(raw.parameters(), lr=0.1)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, optimizer = backend.wrap(raw, optimizer)
    g = torch.Generator().manual_seed(7)  # the same tokens on every rank
    steps = []
    for _ in range(2):
        x = torch.randint(0, config.vocab_size, (2, 32), generator=g)
        y = x.roll(-1, dims=1)
        out, ref = model(x, targets=y), reference(x, targets=y)
        (out.loss + AUX_WEIGHT * sum(out.aux.values())).backward()
        (ref.loss + AUX_WEIGHT * sum(ref.aux.values())).backward()
        grads = dict(model.named_parameters())
        diff = 0.0
        for name, p in reference.named_parameters():
            grad = grads[name].grad
            grad = grad.full_tensor() if isinstance(grad, DTensor) else grad
            diff = max(diff, (grad - p.grad).abs().max().item())
        steps.append({"sharded": summary(out), "reference": summary(ref), "grad_diff": diff})
        backend.step(optimizer, grad_clip=0.0)
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
    return {"n_moe_layers": len(reference.moe_layers()), "steps": steps}
