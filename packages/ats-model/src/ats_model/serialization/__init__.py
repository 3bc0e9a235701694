"""Model directories (save_pretrained / load_pretrained) and HF transformers interop
(export_hf / import_hf): safetensors only, validated on load, never pickle."""

from ats_model.serialization.hf_export import export_hf
from ats_model.serialization.hf_import import import_hf
from ats_model.serialization.model_dir import load_pretrained, save_pretrained

__all__ = ["export_hf", "import_hf", "load_pretrained", "save_pretrained"]
