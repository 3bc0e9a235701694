"""`python -m ats_train.backends.deepspeed_ops` names builders DeepSpeed has (a rename in a
DeepSpeed release would otherwise leave an op to be JIT-built mid-run again)."""

import pytest

pytest.importorskip("deepspeed")

from ats_train.backends.deepspeed_ops import OPS  # noqa: E402


def test_every_op_is_a_builder_of_the_cpu_accelerator():
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    names = {CPU_Accelerator().create_op_builder(op).name for op in OPS}
    assert names == {"cpu_adam", "async_io", "pin_memory", "deepspeed_shm_comm"}
