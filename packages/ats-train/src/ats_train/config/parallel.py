"""[parallel]: the backend that shards and synchronizes training, and its settings."""

from __future__ import annotations

from dataclasses import dataclass

from ats_train.config.choices import (
    BackendName,
    ColossalAIPlugin,
    OffloadDevice,
    check_choices,
    require,
)


@dataclass
class ParallelSection:
    backend: BackendName = "single"
    cpu_offload: bool = False  # fsdp2 only: parameters, gradients and optimizer state on the CPU
    # fsdp2 only: consecutive blocks per fully_shard unit (one all-gather / reduce-scatter each);
    # 0 = all blocks in one unit (then the root: embeddings, final norm, head). Fewer, larger units cost fewer
    # hooks and collectives per step; smaller ones hold fewer gathered parameters at a time.
    fsdp_unit_blocks: int = 1
    # fsdp2 only: false keeps every unit's parameters gathered from its forward to its backward
    # (no second all-gather in backward; each rank holds the whole bf16 model through the step,
    # torchtitan's reshard_after_forward "never"). The last unit and the root never reshard.
    fsdp_reshard_after_forward: bool = True
    colossalai_plugin: ColossalAIPlugin = "low_level_zero"  # colossalai only: LowLevelZero (ZeRO-2)
    # deepspeed only (backends/deepspeed_config.py turns these into DeepSpeed's JSON)
    zero_stage: int = 1  # 1: optimizer state, 2: + gradients, 3: + parameters sharded
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
    deepspeed_config: str = ""  # the user's own DeepSpeed JSON, used instead of the generated one

    def __post_init__(self) -> None:
        check_choices(self, "parallel")
        require(
            not self.cpu_offload or self.backend == "fsdp2",
            f"parallel.cpu_offload = true needs parallel.backend = 'fsdp2', not {self.backend!r}",
        )
        require(
            self.fsdp_unit_blocks >= 0,
            f"parallel.fsdp_unit_blocks = {self.fsdp_unit_blocks} must be >= 0 "
            "(blocks per FSDP2 unit; 0 = all blocks in one unit)",
        )
        require(
            self.fsdp_unit_blocks == 1 or self.backend == "fsdp2",
            f"parallel.fsdp_unit_blocks = {self.fsdp_unit_blocks} needs parallel.backend = "
            f"'fsdp2', not {self.backend!r}",
        )
        require(
            self.fsdp_reshard_after_forward or self.backend == "fsdp2",
            "parallel.fsdp_reshard_after_forward = false needs parallel.backend = 'fsdp2', not "
            f"{self.backend!r}",
        )
        require(
            self.zero_stage in (1, 2, 3),
            f"parallel.zero_stage = {self.zero_stage} is not 1, 2 or 3",
        )
        offloads = {"parallel.offload_optimizer": self.offload_optimizer}
        offloads["parallel.offload_param"] = self.offload_param
        for key, value in offloads.items():
            require(
                value == "none" or self.backend == "deepspeed",
                f"{key} = {value!r} needs parallel.backend = 'deepspeed', not {self.backend!r}",
            )
            require(
                value != "nvme" or self.nvme_path != "",
                f"{key} = 'nvme' needs parallel.nvme_path, a writable local directory",
            )
        require(
            self.offload_param == "none" or self.zero_stage == 3,
            f"parallel.offload_param = {self.offload_param!r} needs parallel.zero_stage = 3 "
            f"(only ZeRO-3 partitions parameters), not {self.zero_stage}",
        )
        require(
            0.0 < self.offload_optimizer_ratio <= 1.0,
            f"parallel.offload_optimizer_ratio = {self.offload_optimizer_ratio} must be in (0, 1]",
        )
        require(
            self.offload_optimizer_ratio == 1.0
            or (self.offload_optimizer == "cpu" and self.zero_stage == 3),
            f"parallel.offload_optimizer_ratio = {self.offload_optimizer_ratio} needs "
            "parallel.offload_optimizer = 'cpu' and parallel.zero_stage = 3 (DeepSpeed splits "
            f"the optimizer only there), not {self.offload_optimizer!r} and {self.zero_stage}",
        )
        require(
            self.offload_optimizer_ratio == 1.0 or self.offload_param != "nvme",
            f"parallel.offload_optimizer_ratio = {self.offload_optimizer_ratio} with "
            "parallel.offload_param = 'nvme': DeepSpeed gives the GPU's sub-groups host fp32 "
            "masters beside GPU gradients when their parameters are on disk; offload the whole "
            "optimizer, or keep parameters in host RAM",
        )
        require(
            self.deepspeed_config == "" or self.backend == "deepspeed",
            f"parallel.deepspeed_config needs parallel.backend = 'deepspeed', not {self.backend!r}",
        )
