"""Pruning and splitting experts in place: weights and AdamW state follow the experts, and the next
optimizer step equals one taken by a fresh AdamW given the same (re-indexed) state."""

import copy

import torch
from ats_model import build_model, presets
from ats_train.expert_surgery import prune_experts, split_experts

NAMES = ("router.weight", "experts.w1", "experts.w3", "experts.w2")


def trained(steps: int = 2):
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-moe"), kernels="reference")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    for _ in range(steps):
        out = model(x, targets=x)
        (out.loss + 0.01 * out.aux["moe_lb"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, x


def snapshot(model, opt):
    out = []
    for layer in model.moe_layers():
        params = [layer.get_parameter(n) for n in NAMES]
        out.append(
            [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}) for p in params]
        )
    return out


def test_prune_keeps_the_chosen_experts_and_their_moments() -> None:
    model, opt, x = trained()
    before = snapshot(model, opt)
    keep = [[0, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7]]
    prune_experts(model, opt, keep)
    assert model.config.moe.n_experts == 7
    in_groups = {id(p) for g in opt.param_groups for p in g["params"]}
    assert len(in_groups) == len(list(model.parameters()))
    for layer, old, k in zip(model.moe_layers(), before, keep, strict=True):
        idx = torch.tensor(k)
        for name, (w, state) in zip(NAMES, old, strict=True):
            p = layer.get_parameter(name)
            assert id(p) in in_groups
            assert torch.equal(p, w[idx])
            assert torch.equal(opt.state[p]["exp_avg"], state["exp_avg"][idx])
            assert torch.equal(opt.state[p]["exp_avg_sq"], state["exp_avg_sq"][idx])
            assert torch.equal(opt.state[p]["step"], state["step"])
    # the next step equals a fresh AdamW loaded with the same state (state_dict round trip)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict shares tensors
    for m, o in ((model, opt), (reference, ref_opt)):
        out = m(x, targets=x)
        (out.loss + 0.01 * out.aux["moe_lb"]).backward()
        o.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_split_copies_the_expert_and_its_moments() -> None:
    model, opt, x = trained()
    before = snapshot(model, opt)
    split_experts(model, opt, [3, 5], noise_std=0.0)
    assert model.config.moe.n_experts == 9
    for layer, old, e in zip(model.moe_layers(), before, [3, 5], strict=True):
        assert layer.expert_bias.shape == (9,)
        for name, (w, state) in zip(NAMES, old, strict=True):
            p = layer.get_parameter(name)
            assert torch.equal(p[:8], w) and torch.equal(p[8], w[e])
            assert torch.equal(opt.state[p]["exp_avg"][8], state["exp_avg"][e])
            assert torch.equal(opt.state[p]["exp_avg_sq"][:8], state["exp_avg_sq"])
    out = model(x, targets=x)  # still trains
    out.loss.backward()
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
