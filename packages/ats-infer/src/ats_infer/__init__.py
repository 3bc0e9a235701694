"""ats_infer: serve ATS model directories (native C++ or torch engine), quantize them to int8/int4,
and export them to GGUF for llama.cpp."""

from ats_infer.engine import ENGINES, load_engine
from ats_infer.gguf_export import export_gguf
from ats_infer.quantize import dequantize, quantize_model_dir

__all__ = ["ENGINES", "dequantize", "export_gguf", "load_engine", "quantize_model_dir"]
