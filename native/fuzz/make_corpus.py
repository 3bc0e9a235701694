"""Writes a seed corpus for fuzz_loader (first byte = target: 0 safetensors, 1 JSON, 2 config.json,
3 model.safetensors of the harness's tiny config, 4 tokenizer.json): small real files of each.

Built from plain dicts and numpy, with no import of ats_model: the native runtime sits below the
model package, and its fuzz seeds are files in the formats the runtime reads (the rule is in
tests/test_architecture.py).
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
from ats_tokenizer import Tokenizer
from safetensors.numpy import save

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
tensors = {
    "tok_embeddings.weight": np.arange(24, dtype=np.float32).reshape(6, 4),
    "layers.0.attn.wq.weight.q": np.arange(16, dtype=np.int8).reshape(4, 4),
    "layers.0.attn.wq.weight.scale": np.ones(4, dtype=np.float32),
    "norm.weight": np.ones(4, dtype=np.float32),
}
(out / "st").write_bytes(b"\0" + save(tensors, metadata={"format": "pt", "ats_dtype": "float32"}))

# config.json of each model family (format_version 1), as ats_model's tiny presets write them
DENSE = {
    "family": "dense",
    "vocab_size": 512,
    "dim": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_kv_head": 2,
    "head_dim": 16,
    "ffn_dim": 128,
    "max_seq_len": 256,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "norm_eps": 1e-05,
    "tie_embeddings": True,
    "init_std": 0.02,
    "dropout": 0.0,
    "ffn_dropout": 0.0,
    "moe": None,
    "mod": None,
    "format_version": 1,
}
MOE = {
    "n_experts": 8,
    "top_k": 2,
    "capacity_factor": None,
    "router_temperature": 1.0,
    "norm_topk": True,
    "n_shared_experts": 0,
    "bias_update_rate": 0.0,
}
MOD = {
    "capacity": 0.5,
    "routing": "learned",
    "placement": "every_n",
    "every_n": 2,
    "predictor_dim": 16,
    "seed": 0,
}
CONFIGS = {
    "tiny-dense": DENSE,
    "tiny-moe": {**DENSE, "family": "moe", "ffn_dim": 64, "moe": MOE},
    "tiny-mod": {**DENSE, "family": "mod", "mod": MOD},
    "tiny-hybrid": {**DENSE, "family": "hybrid", "ffn_dim": 64, "moe": MOE, "mod": MOD},
}
for name, config in CONFIGS.items():
    text = json.dumps(config)
    (out / f"config-{name}").write_bytes(b"\2" + text.encode())
    (out / f"json-{name}").write_bytes(b"\1" + text.encode())
vocab = {"a\u0120b": 0, "\\u00e9": 1, "x": [1.5e-3, -0, True, None, {"k": "\ud83d\ude00"}]}
(out / "json-escapes").write_bytes(b"\1" + json.dumps(vocab).encode())

# target 3: a valid model.safetensors for the harness's TINY_CONFIG (dense, vocab 16, dim 8, one
# layer, 2 query heads and 1 kv head of head_dim 4, ffn_dim 8, tied embeddings), float32 and bfloat16
SHAPES = {
    "tok_embeddings.weight": (16, 8),
    "layers.0.attn_norm.weight": (8,),
    "layers.0.attn.wq.weight": (8, 8),
    "layers.0.attn.wk.weight": (4, 8),
    "layers.0.attn.wv.weight": (4, 8),
    "layers.0.attn.wo.weight": (8, 8),
    "layers.0.ffn_norm.weight": (8,),
    "layers.0.ffn.w1.weight": (8, 8),
    "layers.0.ffn.w3.weight": (8, 8),
    "layers.0.ffn.w2.weight": (8, 8),
    "norm.weight": (8,),
}
rng = np.random.default_rng(0)
weights = {  # as the model initializes: matrices N(0, 0.02), norm gains 1
    name: np.ones(shape, np.float32) if len(shape) == 1 else rng.normal(0, 0.02, shape)
    for name, shape in SHAPES.items()
}


def safetensors_image(dtype: str) -> bytes:
    """The safetensors file of `weights` in F32 or BF16 (bfloat16 = the top 16 bits of float32,
    rounded to nearest even), with the metadata ats_model.save_pretrained writes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "ats_dtype": dtype}}
    body = b""
    for name, value in weights.items():
        f32 = np.ascontiguousarray(value, dtype=np.float32)
        if dtype == "bfloat16":
            bits = f32.view(np.uint32).astype(np.uint64)
            data = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
        else:
            data = f32.astype("<f4").tobytes()
        code = {"float32": "F32", "bfloat16": "BF16"}[dtype]
        header[name] = {
            "dtype": code,
            "shape": list(value.shape),
            "data_offsets": [len(body), len(body) + len(data)],
        }
        body += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensor data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + body


for dtype in ("float32", "bfloat16"):
    (out / f"model-{dtype}").write_bytes(b"\3" + safetensors_image(dtype))
# target 4: a small trained tokenizer
tok = Tokenizer.train(["Hello world, 12345 unicode text. " * 20, "def f(x):\n    return x"], 300)
(out / "tokenizer").write_bytes(b"\4" + tok.to_json().encode())
