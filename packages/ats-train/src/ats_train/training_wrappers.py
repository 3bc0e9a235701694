"""Training wrappers applied from outside the model, in one fixed order: the residual stream's
dtype and the fused head + loss (ats_model.ForwardOptions), the fused projections, the float8
Linear layers (train.precision = "fp8", fp8.py), activation
checkpointing, then torch.compile, then sharding, which the backend's wrap() does right after
(fully_shard per block then the root for fsdp2, DistributedDataParallel for ddp). The model stays
single-device math.

All are applied in place, so parameter names and the saved state dict do not change.
"""

from __future__ import annotations

from typing import Any

from ats_model import ForwardOptions
from ats_model.layers.attention import Attention
from ats_model.layers.ffn import SwiGLUFFN
from ats_model.layers.mod import MoDBlock
from ats_model.layers.norm import RMSNorm
from torch import nn
from torch.utils.checkpoint import checkpoint

from ats_train.config import TrainSection
from ats_train.fp8 import apply_fp8


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of storing them (Chen et al. 2016).

    Non-reentrant checkpointing (saved-tensor hooks) keeps the blocks' side outputs, the MoE / MoD
    records, in the autograd graph. A block must compute the same thing twice, so aux-loss-free
    bias balancing, which changes the router bias inside forward, is refused.
    """
    for layer in model.moe_layers():
        if layer.bias_update_rate > 0:
            raise ValueError(
                "train.activation_checkpointing cannot be combined with MoE bias balancing "
                f"(bias_update_rate = {layer.bias_update_rate}): the bias update in forward "
                "would run again during recomputation"
            )
    for block in model.layers:
        forward = block.forward

        def checkpointed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed


def apply_compile(model: nn.Module) -> None:
    """torch.compile per block, as torchtitan does: identical blocks share one compiled graph and
    compile time stays flat in depth.

    Plain blocks with a dense FFN (every block of a dense model, the unrouted blocks of a MoD
    model) are compiled whole. In MoE and MoD blocks only the static-shape parts are (attention,
    norms, dense/shared SwiGLU): routing, token permutation and per-expert matmuls have
    data-dependent shapes that recompile every step, and torch 2.11's inductor miscompiles the
    Triton permute under dynamic shapes (NameError on an unbound size symbol, seen on the H200).
    """
    for block in model.layers:
        if not isinstance(block, MoDBlock) and isinstance(block.ffn, SwiGLUFFN):
            block.compile()
            continue
        for module in block.modules():
            if isinstance(module, (Attention, RMSNorm, SwiGLUFFN)):
                module.compile()


def apply_training_wrappers(model: nn.Module, train: TrainSection) -> nn.Module:
    model.set_forward_options(
        ForwardOptions(
            autocast_residual=train.residual_stream == "autocast",
            fused_loss=bool(train.fused_loss),
            fused_loss_rows=train.fused_loss_rows,
        )
    )
    model.fuse_projections(bool(train.fused_projections))
    if train.precision == "fp8":
        apply_fp8(model, train.fp8_recipe)
    if train.activation_checkpointing:
        apply_activation_checkpointing(model)
    if train.compile:
        apply_compile(model)
    return model
