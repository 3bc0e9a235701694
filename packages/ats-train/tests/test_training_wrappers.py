"""Activation checkpointing and torch.compile, applied from outside: same math as eager."""

import pytest
import torch
from ats_model import ForwardOptions, build_model, presets
from ats_train.config import TrainSection
from ats_train.training_wrappers import apply_training_wrappers


def _model(preset: str = "tiny-hybrid") -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(presets.get(preset), dtype=torch.float64, kernels="reference")


def _loss_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    x = torch.randint(0, model.config.vocab_size, (2, 24)).to(model.tok_embeddings.weight.device)
    out = model(x, targets=x.roll(-1, dims=1))
    loss = out.loss + 0.1 * sum(out.aux.values())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads


def test_activation_checkpointing_keeps_loss_grads_and_names() -> None:
    loss, grads = _loss_and_grads(_model())
    model = _model()
    names = list(model.state_dict())
    apply_training_wrappers(model, TrainSection(activation_checkpointing=True))
    assert list(model.state_dict()) == names
    ac_loss, ac_grads = _loss_and_grads(model)
    torch.testing.assert_close(ac_loss, loss, rtol=0, atol=0)
    for name, g in grads.items():
        torch.testing.assert_close(ac_grads[name], g, rtol=1e-12, atol=1e-15, msg=name)


def test_activation_checkpointing_refuses_bias_balancing() -> None:
    model = _model()
    model.moe_layers()[0].bias_update_rate = 0.01
    with pytest.raises(ValueError, match="bias_update_rate = 0.01"):
        apply_training_wrappers(model, TrainSection(activation_checkpointing=True))


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-hybrid"])
def test_compile_matches_eager_on_cuda(preset: str) -> None:
    """Per-block torch.compile (inductor) against eager, fp64 on the GPU (CPU compile is slow)."""
    loss, grads = _loss_and_grads(_model(preset).cuda())
    model = _model(preset).cuda()
    names = list(model.state_dict())
    apply_training_wrappers(model, TrainSection(compile=True))
    assert list(model.state_dict()) == names
    compiled_loss, compiled_grads = _loss_and_grads(model)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-10, atol=1e-12)
    for name, g in grads.items():
        torch.testing.assert_close(compiled_grads[name], g, rtol=1e-8, atol=1e-10, msg=name)


@pytest.mark.parametrize(("stream", "want"), [("fp32", False), ("autocast", True)])
def test_residual_stream_sets_the_models_autocast_residual(stream: str, want: bool) -> None:
    model = _model()
    apply_training_wrappers(model, TrainSection(precision="bf16", residual_stream=stream))
    assert model.options.autocast_residual is want


@pytest.mark.parametrize("on", [False, True])
def test_fused_loss_and_projections_reach_the_model(on: bool) -> None:
    """train.fused_loss / fused_loss_rows reach the model as its ForwardOptions, fused_projections
    through fuse_projections (the bare model has them off: its own tests and inference keep the
    plain path)."""
    model = _model()
    assert model.options == ForwardOptions()
    apply_training_wrappers(model, TrainSection(fused_loss=on, fused_loss_rows=7, fused_projections=on))
    assert model.options.fused_loss is on and model.options.fused_loss_rows == 7
    flags = [m.fused for m in model.modules() if hasattr(m, "fused")]
    assert flags and all(f is on for f in flags)
