"""train.precision = "fp8": a clear error off FP8 GPUs, the config rules that go with it, and the
float8 conversion itself (torchao's Float8Linear runs on CPU too), checked against the bf16 model
it replaces."""

import pytest
import torch
from ats_model import build_model, presets
from ats_train.config import ConfigError, TrainConfig, TrainSection
from ats_train.config.parallel import ParallelSection
from ats_train.fp8 import apply_fp8, check_fp8_device
from ats_train.precision import build_precision
from ats_train.training_wrappers import apply_training_wrappers
from torchao.float8.float8_linear import Float8Linear


def _model(preset: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(presets.get(preset), dtype=torch.float32, kernels="reference")


def test_fp8_on_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'fp8' needs a CUDA GPU .* device is cpu"):
        build_precision("fp8", torch.device("cpu"))
    with pytest.raises(ValueError, match="compute capability >= 8.9"):
        check_fp8_device(torch.device("cpu"))


def test_fp8_turns_the_fused_projections_off_and_refuses_them_on():
    assert TrainSection(precision="fp8").fused_projections is False
    assert TrainSection(precision="bf16").fused_projections is True
    with pytest.raises(ConfigError, match="fused_projections = true cannot run with"):
        TrainSection(precision="fp8", fused_projections=True)


def test_fp8_refuses_engines_that_cast_the_model_themselves():
    with pytest.raises(ConfigError, match="'fp8' runs with parallel.backend single"):
        TrainConfig(
            train=TrainSection(precision="fp8"), parallel=ParallelSection(backend="deepspeed")
        )


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_conversion_keeps_names_and_matches_bf16(recipe):
    """Dense: every attention and FFN Linear becomes Float8Linear with the same parameters; the
    LM head stays. The float8 loss is within 2% of the bf16 one (e4m3 keeps ~2 significant
    digits per element, and the errors average out over a 64-wide dot product)."""
    model, reference = _model("tiny-dense"), _model("tiny-dense")
    names = list(model.state_dict())
    converted = apply_fp8(model, recipe)
    assert list(model.state_dict()) == names
    expected = [
        f"layers.{i}.{part}"
        for i in range(2)
        for part in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w3", "ffn.w2")
    ]
    assert sorted(converted) == sorted(expected)
    assert all(isinstance(model.get_submodule(n), Float8Linear) for n in expected)
    x = torch.randint(0, model.config.vocab_size, (4, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, targets=x.roll(-1, dims=1)).loss
        ref = reference(x, targets=x.roll(-1, dims=1)).loss
    assert loss.isfinite() and abs(loss.item() - ref.item()) < 0.02 * ref.item()
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_moe_routers_and_experts_stay_bf16():
    model = _model("tiny-hybrid")
    apply_training_wrappers(model, TrainSection(precision="fp8"))
    kinds = {
        n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }
    assert {n for n, k in kinds.items() if k == "Float8Linear"} == {
        f"layers.{i}.attn.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")
    }
    assert all(k == "Linear" for n, k in kinds.items() if "router" in n or "predictor" in n)
