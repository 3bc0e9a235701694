"""One of rank_checks_runner.py's checks (test_fsdp2_records.py reads it): the FSDP2 backend's clip + update on local shards
(fsdp2_local_step.py) against torch's own clip_grad_norm_ + AdamW on an unsharded copy, both fused
AdamW (the CUDA path; torch has a fused CPU kernel). Both ranks feed the same batch, so FSDP2's
averaged gradient is the copy's. Three steps with the lr changed between them, then one with an inf
gradient that must be skipped. The result (rank 0; None on the others): per step the two norms and
whether it stepped, the max weight difference, and the max difference between the DTensor
optimizer's state_dict (what checkpoints read) and the copy's.
"""

import copy

import torch
from fsdp2_cpu_setup import cpu_fsdp2


def check() -> dict | None:
    backend, config, raw = cpu_fsdp2("tiny-dense")
    ref = copy.deepcopy(raw)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    opt = torch.optim.AdamW(raw.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    model, opt = backend.wrap(raw, opt)
    steps = []
    for i in range(4):
        x = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(i))
        for group in [*opt.param_groups, *ref_opt.param_groups]:
            group["lr"] = 1e-2 / (i + 1)
        model(x, targets=x).loss.backward()
        ref(x, targets=x).loss.backward()
        if i == 3:  # a non-finite gradient on one rank: every rank must skip the update
            if backend.rank == 0:
                next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
            next(ref.parameters()).grad.view(-1)[0] = float("inf")
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5))
        if i < 3:
            ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        norm, stepped = backend.step(opt, grad_clip=0.5)
        steps.append({"norm": norm, "ref_norm": ref_norm, "stepped": stepped})
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    weight_diff = max((full[n] - p).abs().max().item() for n, p in ref.named_parameters())
    state = backend.optimizer_state(opt)  # gathered from the DTensor optimizer, rank 0
    if not backend.is_main:
        return None
    ref_state = ref_opt.state_dict()["state"]
    state_diff = max(
        (state["state"][i][k].float() - ref_state[i][k].float()).abs().max().item()
        for i in ref_state
        for k in ("exp_avg", "exp_avg_sq", "step")
    )
    return {"steps": steps, "weight_diff": weight_diff, "state_diff": state_diff}
