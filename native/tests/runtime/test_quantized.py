"""int8 / int4 weights (quantization.json, written by ats_infer.quantize) against the oracle: an
fp32 ats-model holding the reference dequantization (ats_infer.quantize.dequantize) of the same
codes. The native kernels dot int8/int4 codes with fp32 activations, so logits agree to fp32
rounding; every kernel set this CPU runs (scalar, avx2, avx512) gives the same logits."""

from pathlib import Path

import ats_native
import numpy as np
import pytest
import torch
from ats_infer.quantize import dequantize_tensors, quantize_model_dir
from ats_model import build_model, generate

SCHEMES = [(8, None), (4, 32), (4, 64)]


def dequantized_model(model: torch.nn.Module, qdir: Path) -> torch.nn.Module:
    ref = build_model(model.config).eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in dequantize_tensors(qdir).items()}
    ref.load_state_dict(state)
    return ref


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def available_kernels() -> list[str]:
    f = ats_native.cpu_features()
    names = ["scalar"]
    if f["avx2"] and f["fma"]:
        names.append("avx2")
    if f["avx512f"] and f["avx512bw"] and f["avx512vl"]:
        names.append("avx512")
    if f["neon"]:
        names.append("neon")
    return names


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize(("bits", "group"), SCHEMES)
def test_quantized_logits_match_dequantized_reference(
    saved_model, tmp_path: Path, preset: str, bits: int, group: int | None
) -> None:
    model, directory = saved_model(preset, tie_embeddings=False)
    qdir = quantize_model_dir(directory, tmp_path / "q", bits=bits, group_size=group)
    ref_model = dequantized_model(model, qdir)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(5)
    )
    with torch.no_grad():
        ref = ref_model(ids).logits.numpy()
    native = ats_native.Model(str(qdir), threads=2)
    assert native.weight_format == f"int{bits}"
    assert rel_err(native.logits(ids.numpy()), ref) < 1e-4
    prompt = ids[0, :6]
    with torch.no_grad():
        expected = generate(ref_model, prompt, 12, temperature=0)[6:].tolist()
    assert list(native.generate(prompt.numpy(), 12)) == expected


def test_int4_group_128_and_shared_experts(saved_model, tmp_path: Path) -> None:
    moe = {
        "n_experts": 4,
        "top_k": 2,
        "capacity_factor": None,
        "router_temperature": 1.0,
        "norm_topk": True,
        "n_shared_experts": 1,
        "bias_update_rate": 0.0,
    }
    model, directory = saved_model("tiny-moe", dim=128, head_dim=32, ffn_dim=128, moe=moe)
    qdir = quantize_model_dir(directory, tmp_path / "q", bits=4, group_size=128)
    ref_model = dequantized_model(model, qdir)
    ids = torch.arange(0, 30)[None] * 11 % 512
    with torch.no_grad():
        ref = ref_model(ids).logits.numpy()
    assert rel_err(ats_native.Model(str(qdir), threads=2).logits(ids.numpy()), ref) < 1e-4


@pytest.mark.parametrize(("bits", "group"), [(None, None), *SCHEMES])
def test_kernel_sets_agree(
    saved_model, tmp_path: Path, bits: int | None, group: int | None
) -> None:
    _, directory = saved_model("tiny-moe", tie_embeddings=False)
    if bits is not None:
        directory = quantize_model_dir(directory, tmp_path / "q", bits=bits, group_size=group)
    ids = np.arange(1, 40)[None] * 13 % 512
    outs = {
        k: ats_native.Model(str(directory), threads=2, kernels=k).logits(ids)
        for k in available_kernels()
    }
    for name, out in outs.items():
        assert rel_err(out, outs["scalar"]) < 1e-5, name
    chosen = ats_native.Model(str(directory), threads=1)
    assert chosen.kernels == ats_native.cpu_features()["kernels"]


def test_thread_counts_agree(saved_model) -> None:
    _, directory = saved_model("tiny-hybrid")
    ids = np.arange(1, 60)[None] % 512
    one = ats_native.Model(str(directory), threads=1).logits(ids)
    three = ats_native.Model(str(directory), threads=3).logits(ids)
    np.testing.assert_array_equal(one, three)  # threads split output features: same sums


@pytest.mark.parametrize("bits", [None, 8])
def test_odd_sizes_exercise_kernel_tails(saved_model, tmp_path: Path, bits: int | None) -> None:
    """dim 72, head_dim 18, ffn 100: no size is a multiple of the SIMD width, so every kernel
    runs its tail code; each kernel set still matches the (dequantized) reference."""
    model, directory = saved_model("tiny-dense", dim=72, head_dim=18, ffn_dim=100)
    if bits is not None:
        directory = quantize_model_dir(directory, tmp_path / "q", bits=bits)
        model = dequantized_model(model, directory)
    ids = torch.arange(2, 33)[None] * 5 % 512
    with torch.no_grad():
        ref = model(ids).logits.numpy()
    for name in available_kernels():
        out = ats_native.Model(str(directory), threads=2, kernels=name).logits(ids.numpy())
        assert rel_err(out, ref) < 1e-4, name
