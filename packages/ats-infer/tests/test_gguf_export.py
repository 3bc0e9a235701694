"""gguf_export.py: read the file back with gguf.GGUFReader and check names, shapes, metadata,
vocabulary and values, that the q/k row permutation turns ATS's half-split RoPE into llama.cpp's
interleaved one (same attention scores), and the refusals."""

import dataclasses
import json
import os
import subprocess

import gguf
import numpy as np
import pytest
from ats_infer.gguf_export import export_gguf, permute_rope_rows, unpermute_rope_rows
from ats_infer.model_dir import read_config
from ats_infer.quantize import quantize_model_dir
from ats_infer.tensor_files import load_tensors
from ats_tokenizer import Tokenizer

LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "attn.wq.weight": "attn_q.weight",
    "attn.wk.weight": "attn_k.weight",
    "attn.wv.weight": "attn_v.weight",
    "attn.wo.weight": "attn_output.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn.w1.weight": "ffn_gate.weight",
    "ffn.w3.weight": "ffn_up.weight",
    "ffn.w2.weight": "ffn_down.weight",
    "ffn.router.weight": "ffn_gate_inp.weight",
    "ffn.experts.w1": "ffn_gate_exps.weight",
    "ffn.experts.w3": "ffn_up_exps.weight",
    "ffn.experts.w2": "ffn_down_exps.weight",
}
GLOBAL = {
    "tok_embeddings.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "output.weight": "output.weight",
}


def expected_name(name: str) -> str:
    if name in GLOBAL:
        return GLOBAL[name]
    _, i, rest = name.split(".", 2)
    return f"blk.{i}.{LAYER[rest]}"


def read_back(path) -> tuple[dict[str, object], dict[str, tuple[str, np.ndarray]]]:
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        data = np.array(t.data)
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = gguf.quants.dequantize(data, t.tensor_type)
        tensors[t.name] = (t.tensor_type.name, data.astype(np.float32))
    return fields, tensors


@pytest.mark.parametrize("family_dir", ["dense_dir", "moe_dir"])
def test_f32_export_holds_every_tensor_and_hparam(family_dir, request, tmp_path) -> None:
    model_dir = request.getfixturevalue(family_dir)
    config = read_config(model_dir)
    path = export_gguf(model_dir, tmp_path / "m.gguf", "f32")
    fields, tensors = read_back(path)
    src = load_tensors(model_dir)
    expected = {expected_name(n) for n in src if not n.endswith("expert_bias")}
    assert set(tensors) == expected
    for name, w in src.items():
        if name.endswith("expert_bias"):
            continue
        kind, data = tensors[expected_name(name)]
        assert kind == "F32" and data.shape == w.shape
        if name.endswith("attn.wq.weight"):
            data = unpermute_rope_rows(data, config["n_head"])
        elif name.endswith("attn.wk.weight"):
            data = unpermute_rope_rows(data, config["n_kv_head"])
        np.testing.assert_array_equal(data, w, err_msg=name)
    hparams = {
        "general.architecture": "llama",
        "llama.vocab_size": config["vocab_size"],
        "llama.context_length": config["max_seq_len"],
        "llama.embedding_length": config["dim"],
        "llama.block_count": config["n_layer"],
        "llama.feed_forward_length": config["ffn_dim"],
        "llama.attention.head_count": config["n_head"],
        "llama.attention.head_count_kv": config["n_kv_head"],
        "llama.rope.dimension_count": config["head_dim"],
        "general.file_type": gguf.LlamaFileType.ALL_F32,
    }
    if config["family"] == "moe":
        hparams["llama.expert_count"] = config["moe"]["n_experts"]
        hparams["llama.expert_used_count"] = config["moe"]["top_k"]
    else:
        assert "llama.expert_count" not in fields
    for key, value in hparams.items():
        assert fields[key] == value, key
    assert fields["llama.rope.freq_base"] == pytest.approx(config["rope_theta"])
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(config["norm_eps"])


def test_vocabulary_is_the_byte_level_bpe(dense_dir, tokenizer_json, tmp_path) -> None:
    fields, _ = read_back(export_gguf(dense_dir, tmp_path / "m.gguf"))
    tok = json.loads(tokenizer_json.read_text())  # the HF file itself is the oracle
    vocab = {i: s for s, i in tok["model"]["vocab"].items()}
    specials = {t["id"]: t["content"] for t in tok["added_tokens"]}
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == read_config(dense_dir)["vocab_size"]
    for i, token in enumerate(tokens):
        assert token == (specials[i] if i in specials else vocab[i])
        assert types[i] == (gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    assert fields["tokenizer.ggml.merges"] == merges
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "llama-bpe"  # our GPT-4 pattern is Llama 3's
    eos = Tokenizer.load(tokenizer_json).eos_id
    assert fields["tokenizer.ggml.eos_token_id"] == fields["tokenizer.ggml.bos_token_id"] == eos
    assert fields["tokenizer.ggml.add_bos_token"] is False


def test_a_padded_model_vocabulary_gets_unused_tokens(make_model_dir, tmp_path) -> None:
    model_dir = make_model_dir("tiny-dense", vocab_size=520)  # tokenizer has 512
    fields, tensors = read_back(export_gguf(model_dir, tmp_path / "m.gguf"))
    assert fields["tokenizer.ggml.tokens"][512:] == [f"[PAD{i}]" for i in range(512, 520)]
    assert fields["tokenizer.ggml.token_type"][512:] == [gguf.TokenType.UNUSED] * 8
    assert tensors["token_embd.weight"][1].shape == (520, 64)


def rope_half_split(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """HF rotate_half convention on x (..., hd): pairs (i, i + hd/2)."""
    half = x.shape[-1] // 2
    ang = pos * theta ** (-np.arange(half) * 2 / x.shape[-1])
    a, b = x[..., :half], x[..., half:]
    return np.concatenate(
        [a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1
    )


def rope_interleaved(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """llama.cpp's llama arch / Meta convention on x (..., hd): pairs (2i, 2i + 1)."""
    half = x.shape[-1] // 2
    ang = pos * theta ** (-np.arange(half) * 2 / x.shape[-1])
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[..., 1::2] = b * np.cos(ang) + a * np.sin(ang)
    return out


def test_permutation_keeps_attention_scores_under_llama_cpp_rope(dense_dir, tmp_path) -> None:
    config = read_config(dense_dir)
    nh, nkv, hd, theta = config["n_head"], config["n_kv_head"], config["head_dim"], 10000.0
    _, tensors = read_back(export_gguf(dense_dir, tmp_path / "m.gguf"))
    src = load_tensors(dense_dir)
    wq, wk = src["layers.1.attn.wq.weight"], src["layers.1.attn.wk.weight"]
    gq, gk = tensors["blk.1.attn_q.weight"][1], tensors["blk.1.attn_k.weight"][1]
    np.testing.assert_array_equal(gq, permute_rope_rows(wq, nh))
    assert not np.array_equal(gq, wq)
    h = np.random.default_rng(0).standard_normal((2, config["dim"]))  # two tokens' inputs
    group = nh // nkv
    for p_q, p_k in [(0, 0), (5, 2), (37, 11)]:
        ats_q = rope_half_split((wq @ h[0]).reshape(nh, hd), p_q, theta)
        ats_k = rope_half_split((wk @ h[1]).reshape(nkv, hd), p_k, theta)
        cpp_q = rope_interleaved((gq @ h[0]).reshape(nh, hd), p_q, theta)
        cpp_k = rope_interleaved((gk @ h[1]).reshape(nkv, hd), p_k, theta)
        for j in range(nh):  # q head j reads kv head j // group (HF repeat_kv order)
            ats = ats_q[j] @ ats_k[j // group]
            cpp = cpp_q[j] @ cpp_k[j // group]
            assert cpp == pytest.approx(ats, rel=1e-9, abs=1e-12)
    np.testing.assert_array_equal(unpermute_rope_rows(permute_rope_rows(wk, nkv), nkv), wk)


@pytest.mark.parametrize(
    ("outtype", "kind", "file_type", "tolerance"),
    [
        ("f16", "F16", gguf.LlamaFileType.MOSTLY_F16, 2.0**-11),
        # Q8_0: d = amax / 127 per block of 32, |error| <= d / 2 plus d's own fp16 rounding
        ("q8_0", "Q8_0", gguf.LlamaFileType.MOSTLY_Q8_0, 0.6 / 127),
        # Q4_0: d = -max / 8 per block (max: the signed extreme), codes -8..7, so a value of
        # the opposite sign near -max clamps to 7d: |error| <= |d| = amax / 8 (plus fp16 rounding)
        ("q4_0", "Q4_0", gguf.LlamaFileType.MOSTLY_Q4_0, 1.02 / 8),
    ],
)
def test_lower_precision_exports(moe_dir, tmp_path, outtype, kind, file_type, tolerance) -> None:
    fields, tensors = read_back(export_gguf(moe_dir, tmp_path / "m.gguf", outtype))
    assert fields["general.file_type"] == file_type
    config = read_config(moe_dir)
    for name, w in load_tensors(moe_dir).items():
        if name.endswith("expert_bias"):
            continue
        got_kind, data = tensors[expected_name(name)]
        matmul = name.endswith(("wq.weight", "wk.weight", "wv.weight", "wo.weight"))
        if not (matmul or ".experts." in name or name == "output.weight"):
            # norms and router stay F32; the embedding (only gathered from) follows f16 only
            float_kind = "F16" if kind == "F16" and name == "tok_embeddings.weight" else "F32"
            assert got_kind == float_kind, name
            continue
        assert got_kind == kind, name
        if name.endswith("attn.wq.weight"):
            data = unpermute_rope_rows(data, config["n_head"])
        elif name.endswith("attn.wk.weight"):
            data = unpermute_rope_rows(data, config["n_kv_head"])
        blocks = np.abs(w).reshape(*w.shape[:-1], -1, 32).max(-1)  # (..., in/32) per-block amax
        bound = np.repeat(blocks, 32, axis=-1) * tolerance
        assert np.all(np.abs(data - w) <= bound * (1 + 1e-6) + 1e-8), name


@pytest.mark.parametrize(
    ("preset", "changes", "message"),
    [
        ("tiny-mod", {}, "family = 'mod'"),
        ("tiny-hybrid", {}, "family = 'hybrid'"),
        ("tiny-moe", {"router_temperature": 0.5}, "moe.router_temperature = 0.5"),
        ("tiny-moe", {"capacity_factor": 1.25}, "moe.capacity_factor = 1.25"),
        ("tiny-moe", {"n_shared_experts": 1}, "moe.n_shared_experts = 1"),
        ("tiny-moe", {"bias_update_rate": 0.001}, "moe.bias_update_rate = 0.001"),
        ("tiny-moe", {"norm_topk": False}, "moe.norm_topk = False"),
    ],
)
def test_what_llama_cpp_cannot_express_is_refused(
    make_model_dir, tmp_path, preset, changes, message
) -> None:
    from ats_model import presets

    moe = presets.get(preset).moe
    extra = {"moe": dataclasses.replace(moe, **changes)} if changes else {}
    model_dir = make_model_dir(preset, **extra)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        export_gguf(model_dir, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_nonzero_expert_bias_is_refused(moe_dir, tmp_path) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(moe_dir / "model.safetensors"))
    tensors["layers.0.ffn.expert_bias"][3] = 0.5
    copy = tmp_path / "biased"
    copy.mkdir()
    save_file(tensors, str(copy / "model.safetensors"))
    for file in ("config.json", "tokenizer.json"):
        (copy / file).write_bytes((moe_dir / file).read_bytes())
    with pytest.raises(ValueError, match=r"layers\.0\.ffn\.expert_bias = 'nonzero'"):
        export_gguf(copy, tmp_path / "m.gguf")


def test_bad_inputs_are_refused(make_model_dir, dense_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="outtype 'q5_k' is not one of"):
        export_gguf(dense_dir, tmp_path / "m.gguf", "q5_k")
    q8 = quantize_model_dir(dense_dir, tmp_path / "q8", 8)
    with pytest.raises(ValueError, match="export the float one"):
        export_gguf(q8, tmp_path / "m.gguf")
    odd = make_model_dir("tiny-dense", dim=48, n_head=4, n_kv_head=2, ffn_dim=96)
    with pytest.raises(ValueError, match="rows of 48, not a multiple of the Q8_0 block"):
        export_gguf(odd, tmp_path / "m.gguf", "q8_0")
    (odd / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        export_gguf(odd, tmp_path / "m.gguf")


def test_rope_scaling_becomes_llama_cpp_frequency_factors(make_model_dir, tmp_path) -> None:
    """rope_freqs.weight divides each pair's frequency; the oracle is ats_kernels' scaled table."""
    import torch
    from ats_kernels import rope_tables
    from ats_model.config import RopeScaling

    scaling = RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_seq_len=64
    )
    model_dir = make_model_dir("tiny-dense", rope_scaling=scaling)
    _, tensors = read_back(export_gguf(model_dir, tmp_path / "m.gguf"))
    hd = read_config(model_dir)["head_dim"]

    def inv_freq(s):  # angle at position 1 = the pair's frequency (all < pi here)
        cos, sin = rope_tables(hd, 2, 10000.0, s, dtype=torch.float64)
        return torch.atan2(sin[1, : hd // 2], cos[1, : hd // 2]).numpy()

    factors = inv_freq(None) / inv_freq(scaling)
    assert factors.min() == pytest.approx(1.0) and factors.max() == pytest.approx(8.0)
    np.testing.assert_allclose(tensors["rope_freqs.weight"][1], factors, rtol=1e-6)


LLAMA_CPP_PYTHON = os.environ.get("ATS_LLAMA_CPP_PYTHON")
LLAMA_CPP_LOGITS = """
import sys, numpy as np, llama_cpp
ids = [int(i) for i in sys.argv[2].split(",")]
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_batch=256, n_threads=1,
                      logits_all=True, verbose=False)
llm.eval(ids)
np.save(sys.argv[3], np.array(llm.scores[: len(ids)]))
"""


@pytest.mark.skipif(
    LLAMA_CPP_PYTHON is None,
    reason="set ATS_LLAMA_CPP_PYTHON to a python with llama-cpp-python (benchmarks/native.py "
    "builds one under ~/.cache/ats-bench/llama-venv) to run llama.cpp on the export",
)
@pytest.mark.parametrize("family_dir", ["trained_dense_dir", "moe_dir"])
def test_llama_cpp_runs_the_export_like_ats_model(family_dir, request, oracle, tmp_path) -> None:
    """The outside oracle: llama.cpp's own forward on the GGUF equals ats-model's logits."""
    model_dir = request.getfixturevalue(family_dir)
    path = export_gguf(model_dir, tmp_path / "m.gguf", "f32")
    ids = np.random.default_rng(0).integers(0, 512, 48)
    out = tmp_path / "logits.npy"
    command = [
        LLAMA_CPP_PYTHON,
        "-c",
        LLAMA_CPP_LOGITS,
        str(path),
        ",".join(map(str, ids)),
        str(out),
    ]
    subprocess.run(command, check=True, timeout=300)
    ref = oracle.torch_logits(model_dir, load_tensors(model_dir), ids[None])[0]
    assert np.abs(np.load(out) - ref).max() <= 1e-3 * np.abs(ref).max()
