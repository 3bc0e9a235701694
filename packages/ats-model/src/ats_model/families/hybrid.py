"""Hybrid family: every FFN is MoE; blocks chosen by MoDConfig.placement also route by depth (MoD)."""

from ats_kernels import KernelSet
from torch import nn

from ats_model import families
from ats_model.config import ModelConfig
from ats_model.layers.block import Block
from ats_model.layers.mod import MoDBlock
from ats_model.layers.moe import MoEFFN


def build_block(config: ModelConfig, layer_idx: int, kernels: KernelSet) -> nn.Module:
    block = MoDBlock if config.is_mod_layer(layer_idx) else Block
    return block(config, layer_idx, MoEFFN(config, kernels), kernels)


SPEC = families.register(families.FamilySpec("hybrid", __doc__, build_block))
