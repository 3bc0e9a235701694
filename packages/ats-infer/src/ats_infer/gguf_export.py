"""export_gguf: an ATS float model directory -> one GGUF file llama.cpp runs (arch "llama", which
covers dense Llama and Mixtral-style MoE), written with the `gguf` package's GGUFWriter.

    tok_embeddings.weight        -> token_embd.weight       (kept F32/F16: only rows are gathered)
    layers.i.attn_norm.weight    -> blk.i.attn_norm.weight
    layers.i.attn.wq/wk.weight   -> blk.i.attn_q/attn_k.weight   rows PERMUTED (see below)
    layers.i.attn.wv/wo.weight   -> blk.i.attn_v/attn_output.weight
    layers.i.ffn_norm.weight     -> blk.i.ffn_norm.weight
    layers.i.ffn.w1/w3/w2.weight -> blk.i.ffn_gate/ffn_up/ffn_down.weight
    layers.i.ffn.router.weight   -> blk.i.ffn_gate_inp.weight    (F32)
    layers.i.ffn.experts.w1/w3/w2 (E, out, in) -> blk.i.ffn_gate_exps/ffn_up_exps/ffn_down_exps
    norm.weight -> output_norm.weight, output.weight -> output.weight (absent when tied)

RoPE: ATS rotates the two halves of a head (HF rotate_half); llama.cpp's llama arch rotates adjacent
pairs (Meta's original layout). As llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute) does for HF
checkpoints, the rows of wq and wk are permuted per head so that q.k products are unchanged.
Whatever llama.cpp cannot express (MoD, token dropping, router temperature, selection bias, shared
experts, un-normalized top-k) is refused naming the field.
"""

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from ats_tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer
from ats_tokenizer.bytelevel import bytes_to_unicode_str

from ats_infer.model_dir import open_model_dir
from ats_infer.output_paths import new_file
from ats_infer.tensor_files import TOKENIZER_FILE, path_kind, require_file

OUTTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
# llama.cpp pre-tokenizer names whose regex is ours (src/llama-vocab.cpp): "llama-bpe" is the
# cl100k/Llama-3 pattern, "gpt-2" GPT-2's.
PRE_TOKENIZERS = {GPT4_PATTERN: "llama-bpe", GPT2_PATTERN: "gpt-2"}
GLOBAL_NAMES = {
    "tok_embeddings.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "output.weight": "output.weight",
}
LAYER_NAMES = {
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
# Tensors kept in float at every outtype: norms and router are tiny and llama.cpp wants them F32;
# the embedding is only gathered from (ATS int8/int4 keep it float too).
FLOAT_ONLY = ("token_embd.weight", "_norm.weight", "ffn_gate_inp.weight")


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"export_gguf: {field} = {value!r} cannot be exported to GGUF: {why}")


def check_exportable(config: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Raise on the first config field or tensor llama.cpp's llama arch cannot express (the
    config is checked: model_dir.py)."""
    family = config["family"]
    if family not in ("dense", "moe"):
        _refuse("family", family, "llama.cpp has no Mixture-of-Depths (only dense and moe export)")
    if family == "dense":
        return
    moe = config["moe"]
    rules = (
        ("capacity_factor", None, "llama.cpp never drops tokens"),
        ("router_temperature", 1.0, "llama.cpp's router softmax has no temperature"),
        ("norm_topk", True, "llama.cpp renormalizes the top-k weights"),
        ("bias_update_rate", 0, "llama.cpp has no routing bias"),
        ("n_shared_experts", 0, "the llama arch has no shared experts"),
    )
    for key, allowed, why in rules:
        value = moe[key]
        if value != allowed:
            _refuse(f"moe.{key}", value, why)
    for name, t in tensors.items():
        if name.endswith("ffn.expert_bias") and np.any(t != 0):
            _refuse(name, "nonzero", "llama.cpp has no selection bias")


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Half-split (HF) head rows -> interleaved (Meta) rows, as llama.cpp's LlamaModel.permute:
    within each head, row i of the first half goes to 2i and row i of the second half to 2i + 1."""
    out_dim = w.shape[0]
    return (
        w.reshape(n_head, 2, out_dim // n_head // 2, *w.shape[1:])  # (nh, 2, hd/2, C)
        .swapaxes(1, 2)  # (nh, hd/2, 2, C)
        .reshape(w.shape)
    )


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute_rope_rows (interleaved rows back to half-split)."""
    out_dim = w.shape[0]
    return (
        w.reshape(n_head, out_dim // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def gguf_name(name: str) -> str:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".", 2)  # ["layers", i, rest]
    if len(parts) == 3 and parts[0] == "layers" and parts[2] in LAYER_NAMES:
        return f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise ValueError(f"export_gguf: tensor {name} has no llama.cpp counterpart")


def rope_freq_factors(config: dict[str, Any]) -> np.ndarray:
    """Llama-3.1 frequency scaling as llama.cpp takes it: one divisor per rotated pair
    (rope_freqs.weight), computed as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors."""
    s = config["rope_scaling"]
    head_dim, theta = config["head_dim"], config["rope_theta"]
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    low_wavelen = s["original_max_seq_len"] / s["low_freq_factor"]
    high_wavelen = s["original_max_seq_len"] / s["high_freq_factor"]
    smooth = (s["original_max_seq_len"] / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"]
    )
    mid = 1 / ((1 - smooth) / s["factor"] + smooth)
    factors = np.where(
        wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, s["factor"], mid)
    )
    return factors.astype(np.float32)


def _add_tokenizer(writer: gguf.GGUFWriter, path: Path, vocab_size: int) -> None:
    """GPT-2 style BPE vocabulary: byte-level token strings, merges "a b", special tokens CONTROL."""
    tok = Tokenizer.load(path)
    if tok.pattern not in PRE_TOKENIZERS:
        raise ValueError(f"{path}: a custom pre-tokenizer pattern has no llama.cpp equivalent")
    if tok.vocab_size > vocab_size:
        raise ValueError(f"{path}: {tok.vocab_size} tokens, more than the model's {vocab_size}")
    specials = set(tok.special_tokens.values())
    tokens, types = [], []
    for i in range(vocab_size):
        if i >= tok.vocab_size:  # rows the model pads its vocabulary with
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in specials:
            tokens.append(tok.decode_bytes([i]).decode("utf-8"))
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(bytes_to_unicode_str(tok.decode_bytes([i])))
            types.append(gguf.TokenType.NORMAL)
    merges = [f"{tokens[left]} {tokens[right]}" for left, right, _ in tok.merges]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZERS[tok.pattern])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    # ATS has no BOS; like GPT-2, <|endoftext|> serves as both, and nothing is prepended.
    writer.add_bos_token_id(tok.eos_id)
    writer.add_eos_token_id(tok.eos_id)
    writer.add_add_bos_token(False)


def _add_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], file_type: int) -> None:
    n_head, head_dim, dim = config["n_head"], config["head_dim"], config["dim"]
    writer.add_vocab_size(config["vocab_size"])
    writer.add_context_length(config["max_seq_len"])
    writer.add_embedding_length(dim)
    writer.add_block_count(config["n_layer"])
    writer.add_feed_forward_length(config["ffn_dim"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config["n_kv_head"])
    if head_dim * n_head != dim:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["norm_eps"]))
    if config["family"] == "moe":
        writer.add_expert_count(config["moe"]["n_experts"])
        writer.add_expert_used_count(config["moe"]["top_k"])
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _encode(name: str, w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if name.endswith(FLOAT_ONLY) or w.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        keep_f16 = qtype == gguf.GGMLQuantizationType.F16 and name == "token_embd.weight"
        return w.astype(np.float16 if keep_f16 else np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return w.astype(np.float16)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if w.shape[-1] % block != 0:
        raise ValueError(
            f"export_gguf: {name} has rows of {w.shape[-1]}, not a multiple of the {qtype.name} "
            f"block ({block}); export with --outtype f32 or f16"
        )
    return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)


def export_gguf(
    model_dir: str | Path, out_path: str | Path, outtype: str = "f32", *, force: bool = False
) -> Path:
    """Write the GGUF file of float model directory `model_dir` at `out_path` (an existing
    non-empty file only with `force`, never over an input); returns the path."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    model = open_model_dir(model_dir)
    config = model.config
    if model.quantization is not None:
        raise ValueError(f"{model_dir}: is an ats int8/int4 directory; export the float one")
    tokenizer_path = model.path / TOKENIZER_FILE
    if path_kind(tokenizer_path) == "missing":
        raise FileNotFoundError(f"{model_dir}: no {TOKENIZER_FILE} (GGUF carries the vocabulary)")
    require_file(tokenizer_path)
    tensors = model.tensors()
    check_exportable(config, tensors)
    qtype, file_type = OUTTYPES[outtype]

    out_path = Path(out_path)
    with new_file(out_path, [model.path, *model.files()], force) as tmp:
        writer = gguf.GGUFWriter(tmp, "llama")
        writer.add_name(model.path.resolve().name)
        _add_hparams(writer, config, file_type)
        _add_tokenizer(writer, tokenizer_path, config["vocab_size"])
        if config["rope_scaling"] is not None:
            writer.add_tensor("rope_freqs.weight", rope_freq_factors(config))
        for name, w in tensors.items():
            if name.endswith("ffn.expert_bias"):
                continue  # checked to be zero above
            w = np.asarray(w, dtype=np.float32)
            if name.endswith("attn.wq.weight"):
                w = permute_rope_rows(w, config["n_head"])
            elif name.endswith("attn.wk.weight"):
                w = permute_rope_rows(w, config["n_kv_head"])
            target = gguf_name(name)
            data = _encode(target, w, qtype)
            raw_dtype = None if data.dtype != np.uint8 else qtype
            writer.add_tensor(target, data, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out_path
