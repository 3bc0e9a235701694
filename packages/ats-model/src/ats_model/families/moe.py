"""MoE family: every block's FFN is a Mixture-of-Experts (Mixtral layout when dropless, temp 1)."""

from ats_kernels import KernelSet

from ats_model import families
from ats_model.config import ModelConfig
from ats_model.layers.block import Block
from ats_model.layers.moe import MoEFFN


def build_block(config: ModelConfig, layer_idx: int, kernels: KernelSet) -> Block:
    return Block(config, layer_idx, MoEFFN(config, kernels), kernels)


SPEC = families.register(families.FamilySpec("moe", __doc__, build_block))
