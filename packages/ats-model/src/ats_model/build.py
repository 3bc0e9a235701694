"""build_model: construct on the meta device (no memory), materialize on the target device, init."""

import torch
from ats_kernels import select

from ats_model.config import ModelConfig
from ats_model.model import Transformer


def build_model(
    config: ModelConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    kernels: str = "auto",
) -> Transformer:
    """The kernel set is chosen once here and kept for the model's life. device="meta" returns
    the unmaterialized model (shapes only: parameter counts of 300B-class configs).

    kernels="auto" on a CPU model means the reference kernels even on a CUDA host (the fast
    kernels run on CUDA tensors only); on a CUDA or meta model it is the dispatcher's choice."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model: config must be a ModelConfig, got {type(config).__name__}")
    on_cpu = torch.device(device).type == "cpu"
    kernel_set = select("reference" if kernels == "auto" and on_cpu else kernels)
    with torch.device("meta"):
        model = Transformer(config, kernel_set)
    model = model.to(dtype=dtype)
    if torch.device(device).type == "meta":
        return model
    model = model.to_empty(device=device)
    model.init_weights()
    return model
