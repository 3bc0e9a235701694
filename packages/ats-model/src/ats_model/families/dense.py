"""Dense family: every block is attention + SwiGLU FFN (Llama)."""

from ats_kernels import KernelSet

from ats_model import families
from ats_model.config import ModelConfig
from ats_model.layers.block import Block
from ats_model.layers.ffn import SwiGLUFFN


def build_block(config: ModelConfig, layer_idx: int, kernels: KernelSet) -> Block:
    ffn = SwiGLUFFN(config.dim, config.ffn_dim, kernels, config.ffn_dropout)
    return Block(config, layer_idx, ffn, kernels)


SPEC = families.register(families.FamilySpec("dense", __doc__, build_block))
