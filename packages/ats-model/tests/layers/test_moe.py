"""MoE FFN: aux / z losses against hand computation on fixed logits, exact capacity drops,
dropless parity with a loop over experts, bias balancing, shared experts, router gradients."""

import math

import pytest
import torch
import torch.nn.functional as F
from ats_kernels import ref_grouped_mlp, select
from ats_model import ModelConfig, MoEConfig
from ats_model.layers.moe import MoEFFN, capacity_keep, expert_capacity


def _layer(E: int = 4, k: int = 2, C: int = 4, ffn_dropout: float = 0.0, **moe_kw) -> MoEFFN:
    cfg = ModelConfig(
        ffn_dropout=ffn_dropout,
        family="moe",
        vocab_size=8,
        dim=C,
        n_layer=1,
        n_head=2,
        ffn_dim=6,
        max_seq_len=8,
        moe=MoEConfig(n_experts=E, top_k=k, **moe_kw),
    )
    layer = MoEFFN(cfg, select("reference")).double()
    torch.manual_seed(0)
    layer.init_weights(0.5, 0.5)
    return layer


def _identity_router(layer: MoEFFN) -> None:
    """router(x) = x, so the test controls the logits exactly (needs dim == n_experts)."""
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(layer.n_experts, dtype=torch.float64))


def _loop_moe(layer: MoEFFN, x: torch.Tensor) -> torch.Tensor:
    """HF Mixtral-style reference: per token, softmax, top-k, renormalize, sum of expert MLPs."""
    w = layer.experts
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        probs = torch.softmax(layer.router.weight @ x[n] / layer.temperature, -1)
        top = sorted(range(layer.n_experts), key=lambda e: -probs[e].item())[: layer.top_k]
        norm = sum(probs[e] for e in top) if layer.norm_topk else 1.0
        for e in top:
            h = F.silu(w.w1[e] @ x[n]) * (w.w3[e] @ x[n])
            out[n] += probs[e] / norm * (w.w2[e] @ h)
    return out


def test_aux_and_z_loss_hand_computed() -> None:
    layer = _layer(E=4, k=2, C=4)
    _identity_router(layer)
    logits = [[2.0, 0.0, 1.0, -1.0], [0.0, 3.0, 0.5, 0.0], [1.0, 1.5, 2.0, 0.0]]
    _, rec = layer(torch.tensor(logits, dtype=torch.float64))
    probs = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in logits]
    counts = [0] * 4
    for row in probs:
        for e in sorted(range(4), key=lambda i: -row[i])[:2]:
            counts[e] += 1
    f = [c / (3 * 2) for c in counts]
    P = [sum(row[e] for row in probs) / 3 for e in range(4)]
    lb = 4 * sum(fe * pe for fe, pe in zip(f, P, strict=True))
    z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits) / 3
    assert rec.lb.item() == pytest.approx(lb, rel=1e-12)
    assert rec.z.item() == pytest.approx(z, rel=1e-12)
    assert rec.tokens_per_expert.tolist() == counts
    assert rec.max_violation.item() == pytest.approx(max(counts) / 1.5 - 1)
    entropy = sum(-sum(p * math.log(p) for p in row) for row in probs) / 3
    assert rec.entropy.item() == pytest.approx(entropy, rel=1e-6)


def test_capacity_drops_counted_exactly() -> None:
    # 8 tokens, top-1, capacity_factor 1 -> capacity ceil(1 * 8 * 1 / 4) = 2 slots per expert
    layer = _layer(E=4, k=1, C=4, capacity_factor=1.0)
    _identity_router(layer)
    experts = [0, 0, 0, 0, 0, 0, 1, 2]
    x = F.one_hot(torch.tensor(experts), 4).double() * 5.0
    y, rec = layer(x)
    assert expert_capacity(1.0, 8, 1, 4) == 2
    assert rec.dropped_fraction.item() == 4 / 8
    assert rec.tokens_per_expert.tolist() == [6, 1, 1, 0]  # routed load, before dropping
    reference = _loop_moe(layer, x)
    kept = [True, True, False, False, False, False, True, True]  # position priority within expert 0
    for n in range(8):
        if kept[n]:
            torch.testing.assert_close(y[n], reference[n])
        else:
            assert torch.equal(y[n], torch.zeros(4, dtype=torch.float64))


def test_capacity_priority_first_choices_before_second() -> None:
    # capacity 1 per expert; token 1's 1st choice (expert 0) beats token 0's 2nd choice (expert 0)
    indices = torch.tensor([[1, 0], [0, 2]])
    keep = capacity_keep(indices, torch.tensor([2, 1, 1]), capacity=1)
    assert keep.tolist() == [[True, False], [True, True]]


def test_dropless_drops_nothing_and_matches_loop() -> None:
    layer = _layer(E=4, k=2, C=5)
    x = torch.randn(11, 5, dtype=torch.float64)
    y, rec = layer(x)
    assert rec.dropped_fraction.item() == 0.0
    torch.testing.assert_close(y, _loop_moe(layer, x))
    layer.capacity_factor = 100.0  # huge capacity: same result through the dropping path
    y_cap, rec_cap = layer(x)
    assert rec_cap.dropped_fraction.item() == 0.0
    torch.testing.assert_close(y_cap, y)


def test_runtime_knobs_change_routing() -> None:
    layer = _layer(E=4, k=2, C=5)
    x = torch.randn(6, 5, dtype=torch.float64)
    layer.top_k, layer.temperature = 3, 0.5
    torch.testing.assert_close(layer(x)[0], _loop_moe(layer, x))


def test_shared_experts_add_a_dense_mlp() -> None:
    layer = _layer(E=4, k=1, C=4, n_shared_experts=2)
    assert layer.shared.w1.weight.shape == (12, 4)  # 2 shared experts of width 6, fused
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(x)[0], _loop_moe(layer, x) + layer.shared(x))


def test_expert_dropout_masks_hidden_units_in_training_only() -> None:
    """ffn_dropout inside the experts: each routed row's hidden units, dropped and rescaled."""
    experts = _layer(E=3, k=1, C=4, ffn_dropout=0.5).experts
    x = torch.randn(7, 4, dtype=torch.float64)
    counts = torch.tensor([3, 0, 4])
    plain = ref_grouped_mlp(x, counts, experts.w1, experts.w3, experts.w2)
    torch.manual_seed(7)
    got = experts(x, counts)
    torch.manual_seed(7)
    scale = torch.empty(7, 6).bernoulli_(0.5).div_(0.5)
    assert 0 < int((scale == 0).sum()) < scale.numel()
    want = ref_grouped_mlp(x, counts, experts.w1, experts.w3, experts.w2, hidden_scale=scale)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, plain)
    experts.eval()
    torch.testing.assert_close(experts(x, counts), plain, rtol=0, atol=0)


def test_bias_balancing_updates_only_in_training() -> None:
    layer = _layer(E=4, k=1, C=4, bias_update_rate=0.1)
    _identity_router(layer)
    x = F.one_hot(torch.tensor([0, 0, 0, 1]), 4).double() * 3.0
    layer.eval()
    layer(x)
    assert layer.expert_bias.abs().sum() == 0
    layer.train()
    layer(x)
    # load [3, 1, 0, 0], mean 1: overloaded down, balanced unchanged, underloaded up
    assert layer.expert_bias.tolist() == pytest.approx([-0.1, 0.0, 0.1, 0.1])
    # the bias changes the choice, not the weights: bias 1.0 on expert 3 captures every token
    with torch.no_grad():
        layer.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 1.0]))
    layer.eval()
    _, rec = layer(x)
    assert rec.tokens_per_expert.tolist() == [0, 0, 0, 4]


def test_router_gets_gradient_and_gradcheck() -> None:
    layer = _layer(E=3, k=2, C=4, capacity_factor=1.0)
    x = torch.randn(6, 4, dtype=torch.float64)
    y, rec = layer(x)
    (y.sum() + rec.lb + rec.z).backward()
    assert layer.router.weight.grad.abs().sum() > 0

    def f(router_w: torch.Tensor) -> torch.Tensor:
        out, r = torch.func.functional_call(layer, {"router.weight": router_w}, (x,))
        return out.sum() + r.lb + r.z

    w0 = layer.router.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (w0,))


def test_prune_experts_keeps_the_survivors_function() -> None:
    layer = _layer(E=4, k=1, C=4)
    x = torch.randn(12, 4, dtype=torch.float64)
    before = layer(x)[0]
    choice = layer.router(x).argmax(-1)
    layer.prune_experts([0, 1, 3])  # drop expert 2
    assert (
        layer.n_experts == 3 and layer.experts.w2.shape[0] == 3 and layer.expert_bias.shape == (3,)
    )
    after = layer(x)[0]
    torch.testing.assert_close(after, _loop_moe(layer, x))
    # top-1 with renormalized weights: a token whose expert survived gets the same output
    survived = choice != 2
    assert survived.any() and not survived.all()
    torch.testing.assert_close(after[survived], before[survived])
    assert not torch.allclose(after[~survived], before[~survived])
    with pytest.raises(ValueError, match="fewer than top_k"):
        _layer(E=4, k=2).prune_experts([0])
    with pytest.raises(ValueError, match="distinct experts"):
        layer.prune_experts([0, 0])


def test_split_expert_appends_a_copy() -> None:
    layer = _layer(E=3, k=2, C=4)
    new = layer.split_expert(1)
    assert new == 3 and layer.n_experts == 4
    assert torch.equal(layer.experts.w1[3], layer.experts.w1[1])
    assert torch.equal(layer.router.weight[3], layer.router.weight[1])
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(x)[0], _loop_moe(layer, x))
    layer.split_expert(0, noise_std=0.1)
    assert not torch.equal(layer.experts.w1[4], layer.experts.w1[0])
