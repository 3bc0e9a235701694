"""The native forward against ats-model (the oracle) on the same model directory: fp32 logits
within 1e-4 relative, batches, prefill + decode equal to the full forward, greedy generation
token-identical to ats_model.generate, bf16 weights. The logits and generation checks run once per
kernel set, forced by name (a skip for a set this CPU lacks)."""

import ats_native
import numpy as np
import pytest
import torch
from ats_model import build_model, generate, save_pretrained
from kernel_sets import kernel_params

REL_TOL = 1e-4
PRESETS = ("tiny-dense", "tiny-moe", "tiny-mod", "tiny-hybrid")


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def reference_logits(model: torch.nn.Module, ids: torch.Tensor) -> np.ndarray:
    # MoD layers decide with the causal predictor, as in generation (briefs/native_runtime.md)
    with torch.no_grad():
        return model(ids, causal_routing=True).logits.float().numpy()


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("preset", PRESETS)
def test_logits_match_ats_model(saved_model, preset: str, kernels: str) -> None:
    model, directory = saved_model(preset)
    native = ats_native.Model(str(directory), threads=2, kernels=kernels)
    assert native.kernels == kernels
    ids = torch.randint(
        0, model.config.vocab_size, (3, 19), generator=torch.Generator().manual_seed(1)
    )
    ref = reference_logits(model, ids)
    batched = native.logits(ids.numpy())
    assert batched.shape == ref.shape and batched.dtype == np.float32
    assert rel_err(batched, ref) < REL_TOL
    single = native.logits(ids[1].tolist())  # a plain list, one sequence
    assert single.shape == ref.shape[1:]
    assert rel_err(single, ref[1]) < REL_TOL


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_generation_matches_ats_model(saved_model, preset: str, kernels: str) -> None:
    model, directory = saved_model(preset)
    native = ats_native.Model(str(directory), threads=2, kernels=kernels)
    prompt = torch.randint(
        0, model.config.vocab_size, (9,), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        ref = generate(model, prompt, 24, temperature=0)[len(prompt) :].tolist()
    out = list(native.generate(prompt.numpy(), 24))
    assert out == ref
    assert len(set(out)) > 3, "degenerate model: the test would not see decoding errors"


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-hybrid"])
def test_prefill_then_decode_equals_full_forward(saved_model, preset: str, kernels: str) -> None:
    """Each token the KV-cached decode picks is the argmax of a fresh full forward's last row."""
    model, directory = saved_model(preset)
    native = ats_native.Model(str(directory), threads=2, kernels=kernels)
    prompt = list(range(5, 16))
    out = list(native.generate(prompt, 12))
    full = native.logits(prompt + out)  # (T, V)
    assert full[len(prompt) - 1 : -1].argmax(-1).tolist() == out


def test_generate_batch_matches_single_sequences(saved_model) -> None:
    model, directory = saved_model("tiny-moe")
    native = ats_native.Model(str(directory), threads=2)
    prompts = [[3, 7, 11, 200, 5], [9], list(range(40, 70))]
    batch = native.generate_batch(prompts, 10)
    for prompt, got in zip(prompts, batch, strict=True):
        with torch.no_grad():
            ref = generate(model, torch.tensor(prompt), 10, temperature=0)[len(prompt) :].tolist()
        assert got == ref


def test_stop_tokens_end_generation(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    native = ats_native.Model(str(directory), threads=1)
    free = list(native.generate([1, 2, 3], 10))
    stop = free[4]
    first = free.index(stop)
    assert list(native.generate([1, 2, 3], 10, stop_tokens=[stop])) == free[: first + 1]
    assert native.generate_batch([[1, 2, 3]], 10, stop_tokens=(stop,)) == [free[: first + 1]]
    assert list(native.generate([1, 2, 3], 0)) == []


def test_bf16_weights_load_and_match(saved_model) -> None:
    model, directory = saved_model("tiny-moe", dtype=torch.bfloat16)
    native = ats_native.Model(str(directory), threads=2)
    assert native.weight_format == "bf16"
    ids = torch.arange(0, 24)[None] * 7 % model.config.vocab_size
    # native converts bf16 weights to fp32 once and computes in fp32: the oracle is an fp32 model
    # (fp32 RoPE tables) holding the same bf16-rounded weights
    ref_model = build_model(model.config).eval()
    ref_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref = reference_logits(ref_model, ids)
    assert rel_err(native.logits(ids.numpy()), ref) < REL_TOL


def test_sharded_directory_and_untied_head(saved_model, tmp_path) -> None:
    model, _ = saved_model("tiny-dense", tie_embeddings=False, rope_scaling={"factor": 4.0})
    save_pretrained(model, tmp_path, max_shard_bytes=100_000)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    native = ats_native.Model(str(tmp_path), threads=2)
    ids = torch.arange(3, 40)[None]
    assert rel_err(native.logits(ids.numpy()), reference_logits(model, ids)) < REL_TOL


@pytest.mark.parametrize("routing", ["static", "random"])
def test_mod_position_rules(saved_model, routing: str) -> None:
    model, directory = saved_model(
        "tiny-mod",
        mod={
            "capacity": 0.5,
            "routing": routing,
            "placement": "all",
            "every_n": 2,
            "predictor_dim": 16,
            "seed": 3,
        },
    )
    native = ats_native.Model(str(directory), threads=2)
    ids = torch.arange(1, 30)[None]
    assert rel_err(native.logits(ids.numpy()), reference_logits(model, ids)) < REL_TOL


def test_moe_capacity_shared_experts_bias_temperature(saved_model) -> None:
    moe = {
        "n_experts": 4,
        "top_k": 2,
        "capacity_factor": 0.6,
        "router_temperature": 0.7,
        "norm_topk": False,
        "n_shared_experts": 1,
        "bias_update_rate": 0.0,
    }
    model, directory = saved_model("tiny-moe", moe=moe)
    with torch.no_grad():  # a non-zero expert bias changes the choice, never the weights
        for layer in model.moe_layers():
            layer.expert_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    save_pretrained(model, directory)
    native = ats_native.Model(str(directory), threads=2)
    ids = torch.randint(0, 512, (2, 21), generator=torch.Generator().manual_seed(4))
    assert rel_err(native.logits(ids.numpy()), reference_logits(model, ids)) < REL_TOL


def test_logits_array_owns_its_buffer(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    native = ats_native.Model(str(directory), threads=1)
    out = native.logits([1, 2, 3])
    del native
    assert out.base is not None and np.isfinite(out).all()  # the capsule keeps the C++ buffer
