"""Writes a seed corpus for fuzz_loader (first byte = target: 0 safetensors, 1 JSON, 2 config.json,
3 model.safetensors of the harness's tiny config, 4 tokenizer.json): small real files of each."""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from ats_model import ModelConfig, build_model, presets, save_pretrained
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
for name in ("tiny-dense", "tiny-moe", "tiny-mod", "tiny-hybrid"):
    text = json.dumps(presets.get(name).to_dict())
    (out / f"config-{name}").write_bytes(b"\2" + text.encode())
    (out / f"json-{name}").write_bytes(b"\1" + text.encode())
vocab = {"a\u0120b": 0, "\\u00e9": 1, "x": [1.5e-3, -0, True, None, {"k": "\ud83d\ude00"}]}
(out / "json-escapes").write_bytes(b"\1" + json.dumps(vocab).encode())
# target 3: a valid model.safetensors for the harness's TINY_CONFIG, in float32 and bfloat16
tiny = ModelConfig(
    vocab_size=16,
    dim=8,
    n_layer=1,
    n_head=2,
    n_kv_head=1,
    head_dim=4,
    ffn_dim=8,
    max_seq_len=8,
    tie_embeddings=True,
)
for dtype in (torch.float32, torch.bfloat16):
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(build_model(tiny, dtype=dtype), tmp)
        data = (Path(tmp) / "model.safetensors").read_bytes()
    (out / f"model-{str(dtype)[6:]}").write_bytes(b"\3" + data)
# target 4: a small trained tokenizer
tok = Tokenizer.train(["Hello world, 12345 unicode text. " * 20, "def f(x):\n    return x"], 300)
(out / "tokenizer").write_bytes(b"\4" + tok.to_json().encode())
