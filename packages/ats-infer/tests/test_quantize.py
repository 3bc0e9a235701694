"""quantize.py: the contract's int8/int4 layouts, the |w - dequantize(q)| <= scale/2 bound, the
directory it writes, refusals, and quality on a trained model through the torch oracle."""

import dataclasses
import json

import numpy as np
import pytest
from ats_infer.quantize import (
    dequantize,
    dequantize_tensors,
    quantize_int4,
    quantize_int8,
    quantize_model_dir,
)
from ats_infer.tensor_files import load_tensors
from safetensors.numpy import load_file

RNG = np.random.default_rng(0)
EPS = 1e-6  # float32 rounding of w / scale and q * scale


def weights(*shape: int) -> np.ndarray:
    w = RNG.standard_normal(shape).astype(np.float32) * RNG.uniform(0.01, 3, shape[:-1])[..., None]
    w[..., 0, :] = 0  # a zero row: scale 0, codes 0, exact
    return w.astype(np.float32)


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 64)])
def test_int8_round_trip_is_within_half_a_step(shape: tuple[int, ...]) -> None:
    w = weights(*shape)
    q, scale = quantize_int8(w)
    assert q.dtype == np.int8 and q.shape == w.shape
    assert scale.dtype == np.float32 and scale.shape == w.shape[:-1]
    np.testing.assert_allclose(scale, np.abs(w).max(-1) / 127, rtol=1e-6)
    assert np.abs(q).max() == 127 and q.min() >= -127
    err = np.abs(w - dequantize(q, scale, 8))
    assert np.all(err <= scale[..., None] / 2 * (1 + EPS) + 1e-30)
    assert np.all(q[..., 0, :] == 0) and np.all(scale[..., 0] == 0)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_round_trip_is_within_half_a_step(group_size: int) -> None:
    w = weights(2, 6, 256)
    packed, scale = quantize_int4(w, group_size)
    assert packed.dtype == np.uint8 and packed.shape == (2, 6, 128)
    assert scale.shape == (2, 6, 256 // group_size)
    groups = w.reshape(2, 6, -1, group_size)
    np.testing.assert_allclose(scale, np.abs(groups).max(-1) / 7, rtol=1e-6)
    deq = dequantize(packed, scale, 4, group_size)
    step = np.repeat(scale, group_size, axis=-1)  # (2, 6, 256): the scale of each element
    assert np.all(np.abs(w - deq) <= step / 2 * (1 + EPS) + 1e-30)


def test_int4_packing_follows_the_contract() -> None:
    # Row of 32 elements with chosen codes c_j in [0, 15]: w_j = (c_j - 8) * s, with max|w| = 7s.
    codes = np.array([(3 * j + 1) % 16 for j in range(32)], dtype=np.uint8)
    codes[5] = 15  # +7: the group maximum, so scale = 7s / 7 = s
    codes[codes == 0] = 1  # -8 would exceed 7s in magnitude; the symmetric scheme never emits it
    s = np.float32(0.25)
    w = ((codes.astype(np.float32) - 8) * s)[None]  # (1, 32)
    packed, scale = quantize_int4(w, 32)
    assert scale.tolist() == [[s]]
    expected = [int(codes[2 * k]) | (int(codes[2 * k + 1]) << 4) for k in range(16)]
    assert packed[0].tolist() == expected  # element j in byte j // 2, low nibble for even j
    np.testing.assert_array_equal(dequantize(packed, scale, 4, 32), w)


def test_int4_clamps_to_the_code_range() -> None:
    w = np.array([[-7.0, 7.0, -3.5, 0.4] * 8], dtype=np.float32)  # (1, 32), scale 1
    packed, _ = quantize_int4(w, 32)
    low, high = packed[0] & 0x0F, packed[0] >> 4
    assert set(np.concatenate([low, high]).tolist()) <= set(range(1, 16))
    assert low[0] == 1 and high[0] == 15  # -7 -> code 1, +7 -> code 15


@pytest.mark.parametrize(
    ("bits", "group_size", "message"),
    [
        (3, None, "bits = 3"),
        (4, None, "group_size = None"),
        (4, 16, "group_size = 16"),
        (8, 32, "int8 is per output channel"),
    ],
)
def test_bad_schemes_are_refused(bits, group_size, message, dense_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match=message):
        quantize_model_dir(dense_dir, tmp_path / "out", bits, group_size)


def test_rows_not_divisible_by_the_group_are_refused(dense_dir, tmp_path) -> None:
    # tiny-dense has dim 64: rows of 64 elements cannot hold groups of 128
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.wk\.weight has rows of 64"):
        quantize_model_dir(dense_dir, tmp_path / "out", 4, 128)
    with pytest.raises(ValueError, match="not divisible by group_size 32"):
        quantize_int4(np.ones((2, 48), np.float32), 32)


def test_quantized_sources_and_in_place_writes_are_refused(dense_dir, tmp_path) -> None:
    q8 = quantize_model_dir(dense_dir, tmp_path / "q8", 8)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model_dir(q8, tmp_path / "again", 8)
    with pytest.raises(ValueError, match="is the input"):
        quantize_model_dir(dense_dir, dense_dir, 8)
    with pytest.raises(FileNotFoundError, match=r"not a model directory \(no such directory\)"):
        quantize_model_dir(tmp_path / "missing", tmp_path / "x", 8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"not a model directory \(no config.json\)"):
        quantize_model_dir(tmp_path / "empty", tmp_path / "x", 8)


@pytest.mark.parametrize(("bits", "group_size"), [(8, None), (4, 32)])
def test_directory_layout_follows_the_contract(moe_dir, tmp_path, bits, group_size) -> None:
    out = quantize_model_dir(moe_dir, tmp_path / "q", bits, group_size)
    spec = json.loads((out / "quantization.json").read_text())
    src = load_tensors(moe_dir)
    matmuls = (
        sorted(n for n in src if n.endswith(("wq.weight", "wk.weight", "wv.weight", "wo.weight")))
        + sorted(n for n in src if ".experts.w" in n)
        + ["output.weight"]
    )
    assert spec == {
        "method": "rtn",
        "format_version": 1,
        "bits": bits,
        "group_size": group_size,
        "scheme": "symmetric",
        "quantized": sorted(matmuls),
    }
    written = load_file(str(out / "model.safetensors"))  # safetensors' own reader
    for name, w in src.items():
        if name in matmuls:
            q, scale = written[name + ".q"], written[name + ".scale"]
            if bits == 8:
                assert q.dtype == np.int8 and q.shape == w.shape and scale.shape == w.shape[:-1]
            else:
                assert q.dtype == np.uint8 and q.shape == (*w.shape[:-1], w.shape[-1] // 2)
                assert scale.shape == (*w.shape[:-1], w.shape[-1] // group_size)
            assert scale.dtype == np.float32 and name not in written
        else:  # embeddings, norms, router, expert_bias: kept, as F32, bit for bit
            assert written[name].dtype == np.float32
            np.testing.assert_array_equal(written[name], w)
    assert len(written) == len(src) + len(matmuls)
    for file in ("config.json", "tokenizer.json"):
        assert (out / file).read_bytes() == (moe_dir / file).read_bytes()


def test_bf16_and_sharded_sources_read_like_torch(tmp_path, tokenizer_json) -> None:
    import torch
    from ats_model import build_model, presets, save_pretrained

    config = dataclasses.replace(presets.get("tiny-moe"), tie_embeddings=False)
    model = build_model(config, dtype=torch.bfloat16)
    save_pretrained(model, tmp_path / "bf16", tokenizer_json, max_shard_bytes=100_000)
    assert (tmp_path / "bf16" / "model.safetensors.index.json").is_file()
    tensors = load_tensors(tmp_path / "bf16")
    for name, t in model.state_dict().items():
        np.testing.assert_array_equal(tensors[name], t.float().numpy())
    out = quantize_model_dir(tmp_path / "bf16", tmp_path / "q8", 8)
    deq = dequantize_tensors(out)
    w = model.state_dict()["layers.1.ffn.experts.w2"].float().numpy()
    q, scale = quantize_int8(w)
    np.testing.assert_array_equal(deq["layers.1.ffn.experts.w2"], dequantize(q, scale, 8))


def test_dequantize_refuses_mismatched_layouts() -> None:
    q, scale = quantize_int8(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="int8: expected"):
        dequantize(q.astype(np.uint8), scale, 8)
    with pytest.raises(ValueError, match="int4: expected"):
        dequantize(q.view(np.uint8), scale, 4, 32)


def test_quantization_json_is_validated(dense_dir, tmp_path) -> None:
    out = quantize_model_dir(dense_dir, tmp_path / "q", 4, 32)
    spec = json.loads((out / "quantization.json").read_text())
    spec["bits"] = 2
    (out / "quantization.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="bits = 2"):
        dequantize_tensors(out)


@pytest.mark.parametrize(
    ("bits", "group_size", "max_ppl_ratio", "min_top1"),
    [(8, None, 1.01, 0.99), (4, 32, 1.05, None)],
)
def test_quality_on_a_trained_model(
    trained_dense_dir, held_out_ids, oracle, tmp_path, bits, group_size, max_ppl_ratio, min_top1
) -> None:
    """Issue 7's bars through the Python reference: int8 top-1 >= 99% and perplexity within 1%,
    int4 (groups of 32) perplexity within 5%, on held-out stdlib text."""
    ids = held_out_ids[:, :-1]
    ref = oracle.torch_logits(trained_dense_dir, load_tensors(trained_dense_dir), ids)
    ref_ppl = oracle.perplexity(ref, held_out_ids)
    assert ref_ppl < 100, f"the fixture model did not learn (held-out perplexity {ref_ppl:.1f})"
    out = quantize_model_dir(trained_dense_dir, tmp_path / "q", bits, group_size)
    logits = oracle.torch_logits(trained_dense_dir, dequantize_tensors(out), ids)
    assert oracle.perplexity(logits, held_out_ids) <= ref_ppl * max_ppl_ratio
    if min_top1 is not None:
        assert oracle.top1_agreement(logits, ref) >= min_top1
