"""TrainConfig: the whole config of a run, one section per area, and the checks across sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ats_train.adapters.settings import LoRASection
from ats_train.config.choices import KernelsName, check_choices, require
from ats_train.config.parallel import ParallelSection
from ats_train.config.posttrain import DPOSection, GRPOSection, SFTSection
from ats_train.config.sections import (
    CheckpointSection,
    DataSection,
    LossSection,
    ModelSection,
    OptimSection,
    ProfileSection,
    TrainSection,
)
from ats_train.faults.settings import FaultsSection
from ats_train.orchestrator.settings import OrchestratorSection
from ats_train.planning.settings import PlanSection


@dataclass(frozen=True)
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    loss: LossSection = field(default_factory=LossSection)
    optim: OptimSection = field(default_factory=OptimSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    orchestrator: OrchestratorSection = field(default_factory=OrchestratorSection)
    faults: FaultsSection = field(default_factory=FaultsSection)
    plan: PlanSection = field(default_factory=PlanSection)
    profile: ProfileSection = field(default_factory=ProfileSection)
    sft: SFTSection = field(default_factory=SFTSection)
    dpo: DPOSection = field(default_factory=DPOSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    lora: LoRASection = field(default_factory=LoRASection)  # with train.trainable = 'lora'
    kernels: KernelsName = "auto"  # ats_kernels.select(): chosen once when the model is built

    def __post_init__(self) -> None:
        check_choices(self, "")
        if self.train.overlap_host:
            self._check_overlap_host()
        if self.train.objective != "pretrain":
            self._check_objective()
        if self.parallel.expert_parallel > 1:
            self._check_expert_parallel()
        require(
            self.train.trainable == "lora" or self.lora == LoRASection(),
            f"lora.* is set but train.trainable = {self.train.trainable!r}; set "
            "train.trainable = 'lora' to train an adapter",
        )
        require(
            self.checkpoint.format == "full" or self.parallel.backend != "colossalai",
            "checkpoint.format = 'sharded' is not implemented for parallel.backend = "
            "'colossalai'; use checkpoint.format = 'full'",
        )
        require(
            self.train.precision != "fp8" or self.parallel.backend in ("single", "ddp", "fsdp2"),
            f"train.precision = 'fp8' runs with parallel.backend single, ddp or fsdp2, not "
            f"{self.parallel.backend!r} (its engine casts the model itself)",
        )

    def _check_objective(self) -> None:
        """sft | dpo | grpo start from a model directory and run on the plain step path."""
        objective = self.train.objective
        require(
            self.model.init_from is not None,
            f"train.objective = {objective!r} needs model.init_from = MODEL_DIR (the model to "
            "fine-tune)",
        )
        unsupported = [
            (self.train.cuda_graphs, "train.cuda_graphs"),
            (self.train.overlap_host, "train.overlap_host"),
            (self.faults.loss_spike_at_step is not None, "faults.loss_spike_at_step"),
        ]
        for bad, what in unsupported:
            require(not bad, f"train.objective = {objective!r} cannot run with {what}")
        require(
            objective != "grpo" or self.parallel.backend in ("single", "ddp"),
            f"train.objective = 'grpo' runs with parallel.backend single or ddp, not "
            f"{self.parallel.backend!r}: each rank generates with its own copy of the weights",
        )

    def _check_expert_parallel(self) -> None:
        """Sharded experts (parallel.expert_parallel > 1): refuse what needs every expert on one
        rank, or ranks that do not run the same forwards in step."""
        orchestrator = self.orchestrator
        surgery = [
            f"orchestrator.{kind}.enabled = true"
            for kind in ("prune_experts", "split_expert")
            if orchestrator.mode == "act" and getattr(orchestrator, kind).enabled
        ]
        problems = [
            *surgery,
            *(["train.trainable = 'lora'"] if self.train.trainable == "lora" else []),
            *(["checkpoint.format = 'sharded'"] if self.checkpoint.format == "sharded" else []),
            *(["train.cuda_graphs = true"] if self.train.cuda_graphs else []),
            *(["train.objective = 'grpo'"] if self.train.objective == "grpo" else []),
            *(["train.precision = 'fp16'"] if self.train.precision == "fp16" else []),
        ]
        require(
            not problems,
            f"parallel.expert_parallel = {self.parallel.expert_parallel} cannot run with "
            f"{problems[0] if problems else ''}: expert surgery and LoRA need every expert on one "
            "rank, the sharded optimizer files and CUDA graphs do not know the expert shards, "
            "GRPO's ranks generate apart, and fp16's loss scaler would skip the step on one rank "
            "when only its experts overflow (set it to false, 'all', 'full', another objective "
            "or bf16)",
        )

    def _check_overlap_host(self) -> None:
        """train.overlap_host reads a step's numbers after the next step is queued: refuse what
        must act on them before that (rescale, drill a fault) or reads them in a collective. The
        orchestrator judges each step one step late (its changes land a step later)."""
        faults = [f.name for f in dataclasses.fields(self.faults) if f.name.endswith("_at_step")]
        drills = [name for name in faults if getattr(self.faults, name) is not None]
        problems = [
            (self.parallel.backend == "single", f"parallel.backend = {self.parallel.backend!r}"),
            (self.train.precision != "fp16", "train.precision = 'fp16' (its loss scaler)"),
            (not drills, f"faults.{drills[0] if drills else ''} set"),
        ]
        for ok, what in problems:
            require(
                ok,
                f"train.overlap_host = true cannot run with {what}: needs parallel.backend = "
                "'single', no fp16 and no faults.*, which act on a "
                "step's numbers before the next step starts",
            )
