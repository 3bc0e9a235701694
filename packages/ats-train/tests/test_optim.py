"""AdamW parameter groups: matrices decay; norms, biases and embeddings do not."""

import torch
from ats_model import build_model, presets
from ats_train.config import OptimSection
from ats_train.optim import build_optimizer, split_decay


def test_no_decay_on_norms_biases_and_embeddings() -> None:
    model = build_model(presets.get("tiny-hybrid"), kernels="reference")
    decay, no_decay = split_decay(model)
    names = {n for n, p in model.named_parameters()}
    assert set(decay) | set(no_decay) == names and not set(decay) & set(no_decay)
    assert "tok_embeddings.weight" in no_decay
    assert "norm.weight" in no_decay
    assert all(n in no_decay for n in names if n.endswith("norm.weight"))
    assert "layers.0.attn.wq.weight" in decay
    assert "layers.0.ffn.experts.w1" in decay  # (E, F, C) expert weights
    assert "layers.0.ffn.router.weight" in decay


def test_weight_decay_moves_only_the_decayed_group() -> None:
    """With zero gradients AdamW's update is pure decay: p <- p * (1 - lr * wd)."""
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-hybrid"), kernels="reference")
    optim = OptimSection(lr=0.1, weight_decay=0.5)
    opt = build_optimizer(model, optim, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    decay, no_decay = split_decay(model)
    params = dict(model.named_parameters())
    for n in decay:
        torch.testing.assert_close(params[n], before[n] * (1 - 0.1 * 0.5))
    for n in no_decay:
        assert torch.equal(params[n], before[n]), n
