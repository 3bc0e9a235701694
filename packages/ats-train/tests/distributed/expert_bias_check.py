"""One of rank_checks_runner.py's checks (test_expert_bias.py reads it): two training steps of a
tiny MoE model with aux-loss-free bias balancing, each rank on its own tokens, through a real
backend. The result: every rank's expert_bias right after the first forward (before any sync: they
differ, the loads differ) and after each step (they must be identical).
"""

import dataclasses

import torch
import torch.distributed as dist
from ats_model import build_model, presets
from ats_train.backends import build_backend
from ats_train.config import ParallelSection
from ats_train.precision import build_precision


def gathered_biases(model: torch.nn.Module) -> list[list[list[float]]]:
    """[rank][moe layer] -> expert_bias as lists."""
    mine = [layer.expert_bias.tolist() for layer in model.moe_layers()]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def check(backend_name: str) -> dict[str, list]:
    device = torch.device("cpu")
    backend = build_backend(
        ParallelSection(backend=backend_name), device, build_precision("fp32", device)
    )
    config = presets.get("tiny-hybrid")
    config = dataclasses.replace(config, moe=dataclasses.replace(config.moe, bias_update_rate=0.05))
    torch.manual_seed(0)
    raw = build_model(config, kernels="reference")
    optimizer = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    model, optimizer = backend.wrap(raw, optimizer)
    record: dict[str, list] = {"after_forward": [], "after_step": []}
    g = torch.Generator().manual_seed(100 + backend.rank)  # each rank its own tokens
    for _ in range(2):
        x = torch.randint(0, config.vocab_size, (2, 32), generator=g)
        out = model(x, targets=x.roll(-1, dims=1))
        if not record["after_forward"]:
            record["after_forward"] = gathered_biases(raw)
        loss = out.loss + 0.01 * sum(out.aux.values())  # every parameter gets a gradient
        backend.backward(loss, last_micro_batch=True)
        backend.step(optimizer, grad_clip=1.0)
        record["after_step"].append(gathered_biases(raw))
    return record
