"""[parallel]: the backend that shards and synchronizes training (`parallel.backend`), expert
parallelism for MoE layers (`parallel.expert_parallel`), and one table of settings per backend
that has any: [parallel.fsdp2], [parallel.deepspeed], [parallel.colossalai]. A table's settings need its backend selected; the flat keys they replace
are refused with their new name (RENAMED)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ats_train.config.choices import (
    BackendName,
    ColossalAIPlugin,
    OffloadDevice,
    ZeroStage,
    check_choices,
    require,
)
from ats_train.errors import ConfigError

if TYPE_CHECKING:
    from ats_model import ModelConfig


@dataclass(frozen=True)
class FSDP2Settings:
    cpu_offload: bool = False  # parameters, gradients and optimizer state on the CPU (CUDA only)
    # consecutive blocks per fully_shard unit (one all-gather / reduce-scatter each); 0 = all
    # blocks in one unit (then the root: embeddings, final norm, head). Fewer, larger units cost
    # fewer hooks and collectives per step; smaller ones hold fewer gathered parameters at a time.
    unit_blocks: int = 1
    # false keeps every unit's parameters gathered from its forward to its backward (no second
    # all-gather in backward; each rank holds the whole bf16 model through the step, torchtitan's
    # reshard_after_forward "never"). The last unit and the root never reshard.
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        require(
            self.unit_blocks >= 0,
            f"parallel.fsdp2.unit_blocks = {self.unit_blocks} must be >= 0 "
            "(blocks per FSDP2 unit; 0 = all blocks in one unit)",
        )


@dataclass(frozen=True)
class DeepSpeedSettings:
    """backends/deepspeed_config.py turns these into DeepSpeed's JSON."""

    zero_stage: ZeroStage = 1  # 1: optimizer state, 2: + gradients, 3: + parameters sharded
    offload_optimizer: OffloadDevice = "none"  # none | cpu | nvme (ZeRO-Offload / ZeRO-Infinity)
    offload_param: OffloadDevice = "none"  # none | cpu | nvme; zero_stage 3 only
    nvme_path: str = ""  # a writable local directory; required when an offload is "nvme"
    # ZeRO-3 with offload_optimizer = "cpu" only: the fraction of the optimizer's sub-groups
    # (fp32 masters, Adam moments, fp32 gradients) stepped on the host; the rest stays on the GPU
    # (DeepSpeed's partial offload). Below 1 it trades GPU memory for host memory and CPU time.
    offload_optimizer_ratio: float = 1.0
    # pinned host buffers for offload (cuda only): faster copies, but torch rounds every pinned
    # allocation up to a power of two (pytorch#150517), up to 2x the host memory of the buffers
    offload_pin_memory: bool = True
    config: str = ""  # the user's own DeepSpeed JSON, used instead of the generated one

    def __post_init__(self) -> None:
        check_choices(self, "parallel.deepspeed")
        for what in ("optimizer", "param"):
            value = getattr(self, f"offload_{what}")
            require(
                value != "nvme" or self.nvme_path != "",
                f"parallel.deepspeed.offload_{what} = 'nvme' needs parallel.deepspeed.nvme_path, "
                "a writable local directory",
            )
        require(
            self.offload_param == "none" or self.zero_stage == 3,
            f"parallel.deepspeed.offload_param = {self.offload_param!r} needs "
            f"parallel.deepspeed.zero_stage = 3 (only ZeRO-3 partitions parameters), not "
            f"{self.zero_stage}",
        )
        ratio = self.offload_optimizer_ratio
        require(
            0.0 < ratio <= 1.0,
            f"parallel.deepspeed.offload_optimizer_ratio = {ratio} must be in (0, 1]",
        )
        require(
            ratio == 1.0 or (self.offload_optimizer == "cpu" and self.zero_stage == 3),
            f"parallel.deepspeed.offload_optimizer_ratio = {ratio} needs "
            "parallel.deepspeed.offload_optimizer = 'cpu' and parallel.deepspeed.zero_stage = 3 "
            "(DeepSpeed splits the optimizer only there), not "
            f"{self.offload_optimizer!r} and {self.zero_stage}",
        )
        require(
            ratio == 1.0 or self.offload_param != "nvme",
            f"parallel.deepspeed.offload_optimizer_ratio = {ratio} with "
            "parallel.deepspeed.offload_param = 'nvme': DeepSpeed gives the GPU's sub-groups host "
            "fp32 masters beside GPU gradients when their parameters are on disk; offload the "
            "whole optimizer, or keep parameters in host RAM",
        )


@dataclass(frozen=True)
class ColossalAISettings:
    plugin: ColossalAIPlugin = "low_level_zero"  # LowLevelZero (ZeRO-2)

    def __post_init__(self) -> None:
        check_choices(self, "parallel.colossalai")


@dataclass(frozen=True)
class ParallelSection:
    backend: BackendName = "single"
    # N > 1: every MoE layer's experts split over groups of N ranks, tokens exchanged by
    # all-to-all (backends/expert_parallel.py); N divides the world size and model.moe.n_experts
    expert_parallel: int = 1
    fsdp2: FSDP2Settings = field(default_factory=FSDP2Settings)
    deepspeed: DeepSpeedSettings = field(default_factory=DeepSpeedSettings)
    colossalai: ColossalAISettings = field(default_factory=ColossalAISettings)

    def __post_init__(self) -> None:
        check_choices(self, "parallel")
        ep = self.expert_parallel
        require(
            type(ep) is int and ep >= 1,
            f"parallel.expert_parallel = {_shown(ep)} must be an int >= 1 (1 = experts replicated)",
        )
        require(
            ep == 1 or self.backend in EXPERT_PARALLEL_BACKENDS,
            f"parallel.expert_parallel = {ep} runs with parallel.backend "
            f"{' or '.join(EXPERT_PARALLEL_BACKENDS)}, not {self.backend!r}",
        )
        require(
            ep == 1 or not self.fsdp2.cpu_offload,
            f"parallel.expert_parallel = {ep} cannot run with parallel.fsdp2.cpu_offload = true: "
            "the expert shards stay outside FSDP2 on the GPU while the offloaded parameters "
            "step on the host (set expert_parallel = 1 or cpu_offload = false)",
        )
        for backend in ("fsdp2", "deepspeed", "colossalai"):
            if backend == self.backend:
                continue
            settings, default = getattr(self, backend), type(getattr(self, backend))()
            changed = [
                f"parallel.{backend}.{f.name} = {_shown(getattr(settings, f.name))}"
                for f in dataclasses.fields(settings)
                if getattr(settings, f.name) != getattr(default, f.name)
            ]
            require(
                not changed,
                f"{', '.join(changed)} need{'s' if len(changed) == 1 else ''} parallel.backend = "
                f"{backend!r}, not {self.backend!r}",
            )


# the backends whose gradient reduction keeps the sharded experts apart (backends/ddp.py,
# backends/fsdp2.py)
EXPERT_PARALLEL_BACKENDS = ("ddp", "fsdp2")


def check_expert_parallel(size: int, model: ModelConfig, world_size: int) -> None:
    """parallel.expert_parallel = size against the model and the launch (1 always holds); the
    model is known once its preset is resolved, the world size once the ranks joined."""
    if size == 1:
        return
    if model.moe is None:
        raise ConfigError(
            f"parallel.expert_parallel = {size} needs a model with MoE layers (family moe or "
            f"hybrid), not family {model.family!r}"
        )
    if model.moe.n_experts % size != 0:
        raise ConfigError(
            f"parallel.expert_parallel = {size} must divide model.moe.n_experts = "
            f"{model.moe.n_experts} (each rank holds n_experts / expert_parallel experts)"
        )
    if world_size % size != 0:
        raise ConfigError(
            f"parallel.expert_parallel = {size} must divide the world size {world_size} "
            "(torchrun --nproc-per-node)"
        )


def _shown(value: object) -> str:
    """A value as TOML writes it: true / false, quoted strings, numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


# The flat [parallel] keys each backend's settings had before they moved to its own table.
RENAMED = {
    "parallel.cpu_offload": "parallel.fsdp2.cpu_offload",
    "parallel.fsdp_unit_blocks": "parallel.fsdp2.unit_blocks",
    "parallel.fsdp_reshard_after_forward": "parallel.fsdp2.reshard_after_forward",
    "parallel.colossalai_plugin": "parallel.colossalai.plugin",
    "parallel.deepspeed_config": "parallel.deepspeed.config",
    **{
        f"parallel.{name}": f"parallel.deepspeed.{name}"
        for name in (
            "zero_stage",
            "offload_optimizer",
            "offload_param",
            "nvme_path",
            "offload_optimizer_ratio",
            "offload_pin_memory",
        )
    },
}
