"""Parity figures of the CUDA backend (the tests in native/tests/runtime/test_cuda.py hold them to
tolerances; this prints the numbers): for random-init tiny-dense and tiny-moe models in fp32,
bf16, int8 and int4 (groups of 32), the largest and the median per-token relative logit error of
Model(device="cuda") against the CPU runtime (max |gpu - cpu| / max |cpu| over a token's vocab),
and the fp32 / bf16 ones against ats-model in fp32. One JSON line per model and scheme.
Run (GPU machine, the CUDA build on PYTHONPATH): python3 native/tools/cuda_parity.py"""

import dataclasses
import json
import tempfile
from pathlib import Path

import ats_native
import numpy as np
import torch
from ats_infer.quantize import quantize_model_dir
from ats_model import build_model, presets, save_pretrained


def token_errs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ats-cuda-parity-"))
    for preset in ("tiny-dense", "tiny-moe"):
        config = dataclasses.replace(presets.get(preset), init_std=0.2)
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            model = build_model(config, dtype=dtype).eval()
            base = tmp / f"{preset}-{str(dtype)[6:]}"
            save_pretrained(model, base)
            ids = np.random.default_rng(0).integers(0, config.vocab_size, (4, 64))
            # the oracle: fp32 ats-model (fp32 RoPE tables) holding the same (bf16) weights
            oracle = build_model(config).eval()
            oracle.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
            with torch.no_grad():
                ref = oracle(torch.from_numpy(ids)).logits.numpy()
            dirs = {str(dtype)[6:]: base}
            if dtype == torch.float32:
                dirs["int8"] = quantize_model_dir(base, tmp / f"{preset}-int8", 8)
                dirs["int4-g32"] = quantize_model_dir(base, tmp / f"{preset}-int4", 4, 32)
            for scheme, path in dirs.items():
                gpu = ats_native.Model(str(path), device="cuda").logits(ids)
                cpu = ats_native.Model(str(path), threads=4).logits(ids)
                errs = token_errs(gpu, cpu)
                row = {"model": preset, "scheme": scheme, "tokens": int(errs.size)}
                row.update(vs_cpu_max=float(errs.max()), vs_cpu_median=float(np.median(errs)))
                if not scheme.startswith("int"):
                    row["vs_ats_model_max"] = float(token_errs(gpu, ref).max())
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
