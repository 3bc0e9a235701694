"""LoRA against its own merged model (the oracle: W + (alpha/r) B A written into the weights), the
base model (B = 0, adapter disabled), and finite differences, on the fused and plain paths."""

import copy

import pytest
import torch
from ats_model import build_model
from ats_model.adapters import LoRAConfig, apply_lora, disabled_adapter, merge_lora
from ats_model.adapters.lora import lora_state_dict, merged_state_dict
from ats_model.layers.lora import ExpertsLoRA, LoRALinear

ALL = ("wq", "wk", "wv", "wo", "w1", "w3", "w2", "router")


def _all(family: str) -> tuple[str, ...]:
    return ALL if family in ("moe", "hybrid") else ALL[:-1]  # a dense model has no router


def _model(make_config, family: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_model(make_config(family, **kw), dtype=torch.float64)


def _randomize_lora(model, seed: int = 1) -> None:
    """B = 0 makes the update vanish; give every adapter tensor random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def _logits(model, idx, fused: bool = False):
    model.fuse_projections(fused)
    with torch.set_grad_enabled(fused):  # the fused GEMMs run only with gradients on
        return model(idx).logits.detach()


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_fresh_adapter_leaves_the_model_exactly_unchanged(make_config, family: str) -> None:
    model = _model(make_config, family)
    idx = torch.randint(0, 23, (2, 7))
    base = _logits(model, idx)
    apply_lora(model, LoRAConfig(rank=3, alpha=6.0, targets=_all(family)))
    assert torch.equal(_logits(model, idx), base)


@pytest.mark.parametrize("family", ["dense", "moe", "hybrid"])
@pytest.mark.parametrize("fused", [False, True])
def test_lora_forward_equals_the_merged_model(make_config, family: str, fused: bool) -> None:
    model = _model(make_config, family)
    idx = torch.randint(0, 23, (2, 7))
    base = _logits(model, idx)
    adapted = apply_lora(model, LoRAConfig(rank=3, alpha=6.0, targets=_all(family)))
    assert any("experts.w1" in a for a in adapted) == (family != "dense")
    _randomize_lora(model)
    lora = _logits(model, idx, fused)
    merged = merge_lora(copy.deepcopy(model))
    assert not any(isinstance(m, (LoRALinear, ExpertsLoRA)) for m in merged.modules())
    assert set(merged.state_dict()) == set(_model(make_config, family).state_dict())
    torch.testing.assert_close(lora, _logits(merged, idx), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(lora, base, atol=1e-3)  # the adapter does change the output


def test_disabled_adapter_runs_the_base_weights_and_restores(make_config) -> None:
    model = _model(make_config, "moe")
    idx = torch.randint(0, 23, (1, 5))
    base = _logits(model, idx)
    apply_lora(model, LoRAConfig(rank=2, targets=ALL))
    _randomize_lora(model)
    adapted = _logits(model, idx, fused=True)
    with disabled_adapter(model):
        # fused and plain GEMMs block the sums differently: equal to rounding, not bitwise
        torch.testing.assert_close(_logits(model, idx, fused=True), base, rtol=0, atol=1e-12)
        assert torch.equal(_logits(model, idx), base)
    torch.testing.assert_close(_logits(model, idx, fused=True), adapted, rtol=0, atol=0)
    with pytest.raises(ValueError, match="carries no LoRA adapter"):
        with disabled_adapter(_model(make_config, "dense")):
            pass


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_lora_gradient_matches_finite_differences(make_config, family: str) -> None:
    model = _model(make_config, family)
    apply_lora(model, LoRAConfig(rank=2, alpha=4.0, targets=_all(family)))
    _randomize_lora(model)
    model.fuse_projections(True)
    idx = torch.randint(0, 23, (2, 6))
    targets = torch.randint(0, 23, (2, 6))
    params = dict(model.named_parameters())
    names = [n for n in params if "lora" in n]
    loss = model(idx, targets=targets).loss
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    eps, g = 1e-6, torch.Generator().manual_seed(3)
    for name, grad in zip(names, grads, strict=True):
        p = params[name]
        i = int(torch.randint(0, p.numel(), (1,), generator=g))
        with torch.no_grad():
            orig = p.view(-1)[i].item()
            p.view(-1)[i] = orig + eps
            up = model(idx, targets=targets).loss.item()
            p.view(-1)[i] = orig - eps
            down = model(idx, targets=targets).loss.item()
            p.view(-1)[i] = orig
        fd = (up - down) / (2 * eps)
        assert abs(fd - grad.view(-1)[i].item()) < 1e-6 * max(1.0, abs(fd)), name


def test_adapter_sizes_are_counted_by_hand(make_config) -> None:
    # dim 8, head_dim 4, n_head 2, n_kv_head 1, ffn 12, 4 experts, 2 layers, rank 3
    model = _model(make_config, "moe")
    apply_lora(model, LoRAConfig(rank=3, targets=("wq", "wv", "w2", "router")))
    sizes = {k: tuple(v.shape) for k, v in lora_state_dict(model).items()}
    assert sizes["layers.0.attn.wq.lora_A"] == (3, 8)
    assert sizes["layers.0.attn.wq.lora_B"] == (8, 3)
    assert sizes["layers.1.attn.wv.lora_B"] == (4, 3)
    assert sizes["layers.0.ffn.experts.lora.w2_A"] == (4, 3, 12)
    assert sizes["layers.0.ffn.experts.lora.w2_B"] == (4, 8, 3)
    assert sizes["layers.0.ffn.router.lora_B"] == (4, 3)
    per_layer = 3 * (8 + 8) + 3 * (8 + 4) + 4 * 3 * (12 + 8) + 3 * (8 + 4)
    assert sum(v.numel() for v in lora_state_dict(model).values()) == 2 * per_layer


def test_bad_settings_are_refused(make_config) -> None:
    with pytest.raises(ValueError, match="lora.rank"):
        LoRAConfig(rank=0)
    with pytest.raises(ValueError, match="lora.targets"):
        LoRAConfig(targets=("q_proj",))
    with pytest.raises(ValueError, match="weight form"):
        apply_lora(_model(make_config, "moe"), LoRAConfig(dropout=0.1, targets=("w1",)))
    with pytest.raises(ValueError, match=r"\['router'\] match no weight"):
        apply_lora(_model(make_config, "dense"), LoRAConfig(targets=("wq", "router")))
    model = _model(make_config, "dense")
    apply_lora(model, LoRAConfig(targets=("wq",)))
    with pytest.raises(ValueError, match="already has an adapter"):
        apply_lora(model, LoRAConfig(targets=("wq",)))


def test_merged_state_dict_equals_merge_lora(make_config) -> None:
    model = _model(make_config, "hybrid")
    lora = LoRAConfig(rank=3, alpha=5.0, targets=ALL)
    apply_lora(model, lora)
    _randomize_lora(model)
    merged = merged_state_dict(dict(model.state_dict()), lora.alpha / lora.rank)
    expected = merge_lora(copy.deepcopy(model)).state_dict()
    assert set(merged) == set(expected)
    for k, v in expected.items():
        torch.testing.assert_close(merged[k], v, rtol=1e-12, atol=1e-12)
