"""import_hf: an HF LlamaForCausalLM / MixtralForCausalLM directory (config.json + safetensors,
single or sharded) -> an ATS model with bit-identical weights, in the dtype the file stores."""

from pathlib import Path
from typing import Any

import torch

from ats_model.build import build_model
from ats_model.config import ModelConfig
from ats_model.serialization.hf_llama import (
    llama_config_fields,
    llama_state_from_hf,
    llama_state_to_hf,
)
from ats_model.serialization.hf_mixtral import (
    mixtral_config_fields,
    mixtral_state_from_hf,
    mixtral_state_to_hf,
    unfuse_mixtral,
)
from ats_model.serialization.model_dir import (
    CONFIG_FILE,
    check_layer_count,
    check_tensors,
    dtype_name,
    read_config_json,
)
from ats_model.serialization.safetensors_io import TensorInfo, load_tensors, read_tensor_infos

MODEL_TYPES = ("llama", "mixtral")


def read_hf_config(directory: Path) -> dict[str, Any]:
    hf = read_config_json(directory)
    if hf.get("model_type") not in MODEL_TYPES:
        raise ValueError(
            f"{CONFIG_FILE}: model_type = {hf.get('model_type')!r} cannot be imported: "
            f"expected one of {MODEL_TYPES}"
        )
    return hf


def _expected_hf_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The HF-named tensors (on the meta device: shapes and dtypes only) an export of `model`
    would write, i.e. what a checkpoint for its config must hold."""
    meta = {k: torch.empty_like(t, device="meta") for k, t in model.state_dict().items()}
    if model.config.moe is None:
        return llama_state_to_hf(meta)
    return mixtral_state_to_hf(meta)


def import_hf(
    directory: str | Path, device: str | torch.device = "cpu", kernels: str = "auto"
) -> torch.nn.Module:
    """Read an HF Llama/Mixtral directory into an ATS model (dense or MoE family), in the dtype
    its tensors are stored in; names, shapes and dtypes are checked and the first mismatch named."""
    directory = Path(directory)
    hf = read_hf_config(directory)
    if hf["model_type"] == "llama":
        fields = {"family": "dense", **llama_config_fields(hf, default_theta=10000.0)}
    else:
        fields = mixtral_config_fields(hf)
    try:
        config = ModelConfig(**fields)
    except ValueError as e:
        raise ValueError(f"{CONFIG_FILE}: {e}") from e
    infos, _, source = read_tensor_infos(directory)
    dtypes = {info.dtype for info in infos.values()}
    if len(dtypes) != 1:
        raise ValueError(
            f"{source}: tensors have dtypes {sorted(map(dtype_name, dtypes))}; expected one"
        )
    dtype = dtypes.pop()
    check_layer_count(infos, config.n_layer, source)
    # Shapes are checked against a meta model: nothing of config.json's sizes is allocated first.
    meta = build_model(config, device="meta", dtype=dtype, kernels=kernels)
    tensors = load_tensors(directory, infos)
    if config.moe is not None:
        tensors = unfuse_mixtral(tensors)
    if config.tie_embeddings and "lm_head.weight" in tensors:
        # Some HF saves keep a copy of the tied head; it must be that copy.
        if not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
            raise ValueError(
                f"{source}: lm_head.weight differs from model.embed_tokens.weight although "
                f"{CONFIG_FILE} sets tie_word_embeddings"
            )
        del tensors["lm_head.weight"]
    found = {
        k: TensorInfo(infos[k].file if k in infos else source, t.dtype, tuple(t.shape))
        for k, t in tensors.items()
    }
    origin = f"{CONFIG_FILE} ({hf['model_type']})"
    check_tensors(found, _expected_hf_tensors(meta), source, origin)
    model = build_model(config, device=device, dtype=dtype, kernels=kernels)
    if config.moe is None:
        state = llama_state_from_hf(tensors, source)
    else:
        state = mixtral_state_from_hf(tensors, source)
    for key, ref in model.state_dict().items():
        if key.endswith(".ffn.expert_bias"):
            state[key] = torch.zeros_like(ref)  # HF routing has no selection bias
    model.load_state_dict(state, strict=True)
    return model
