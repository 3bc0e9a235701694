"""Validation loss does not depend on the world size: one checkpoint evaluated by 1 process and by
2 gloo ranks (fsdp2) gives the same loss. Each run evaluates train.eval_batches global
batches of train.batch_size windows, split over ranks, token-weighted across ranks.

Tolerance 1e-6 relative: fp32 forwards of the same windows with the same micro-batch size; only
the order of the float64 cross-rank sum differs. (Before, each rank took eval_batches batches of
micro_batch_size windows, so 2 ranks evaluated other windows than 1 rank.)
"""

import json
import shutil
from pathlib import Path

import pytest
from ats_train_torchrun import REFERENCE_EXTRA, RUN_VALUES, STEPS, launch

pytestmark = [pytest.mark.dist, pytest.mark.slow]

RUNNER = Path(__file__).with_name("evaluate_runner.py")
RTOL = 1e-6


def test_one_and_two_ranks_give_the_same_val_loss(
    single_reference: Path,
    overrides,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """The checkpoint: conftest's single-process run (fp32, micro-batches of 1), at its last step."""
    results = {}
    for name, backend, nproc in (("1", "single", None), ("2", "fsdp2", 2)):
        run_dir, out = tmp_path / name, tmp_path / f"{name}.json"
        shutil.copytree(single_reference, run_dir)
        values = {**RUN_VALUES, **REFERENCE_EXTRA, "train__eval_batches": 3}
        args = overrides(**values, parallel__backend=backend)
        proc = launch([str(RUNNER), str(run_dir), str(out), *args], nproc)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads(out.read_text())
    assert {r["step"] for r in results.values()} == {STEPS}
    assert results["2"]["val_loss"] == pytest.approx(results["1"]["val_loss"], rel=RTOL)
