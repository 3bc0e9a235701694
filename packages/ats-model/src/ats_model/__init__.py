"""ats_model: dense, MoE, MoD and hybrid Llama-style transformers (single-device math)."""

from ats_model import presets
from ats_model.build import build_model
from ats_model.config import MoDConfig, ModelConfig, MoEConfig, RopeScaling
from ats_model.flops import count_params, flops_per_token
from ats_model.generate import generate
from ats_model.layers.kv_cache import KVCache
from ats_model.mod_schedule import mod_capacity_schedule, set_mod_capacity
from ats_model.model import ForwardOptions, Transformer
from ats_model.output import ModelOutput
from ats_model.serialization import export_hf, import_hf, load_pretrained, save_pretrained

__all__ = [
    "ForwardOptions",
    "KVCache",
    "MoDConfig",
    "ModelConfig",
    "ModelOutput",
    "MoEConfig",
    "RopeScaling",
    "Transformer",
    "build_model",
    "count_params",
    "export_hf",
    "flops_per_token",
    "generate",
    "import_hf",
    "load_pretrained",
    "mod_capacity_schedule",
    "presets",
    "save_pretrained",
    "set_mod_capacity",
]
