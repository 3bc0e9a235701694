"""MoD family: dense blocks, those chosen by MoDConfig.placement wrapped in Mixture-of-Depths routing."""

from ats_kernels import KernelSet
from torch import nn

from ats_model import families
from ats_model.config import ModelConfig
from ats_model.layers.block import Block
from ats_model.layers.ffn import SwiGLUFFN
from ats_model.layers.mod import MoDBlock


def build_block(config: ModelConfig, layer_idx: int, kernels: KernelSet) -> nn.Module:
    ffn = SwiGLUFFN(config.dim, config.ffn_dim, kernels, config.ffn_dropout)
    block = MoDBlock if config.is_mod_layer(layer_idx) else Block
    return block(config, layer_idx, ffn, kernels)


SPEC = families.register(families.FamilySpec("mod", __doc__, build_block))
