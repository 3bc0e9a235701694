"""`dist` tests: this folder is put on sys.path so test modules can import the one launch helper
(ats_train_torchrun.py) under --import-mode=importlib. Session fixtures share the launches that
several tests read: the single-process run the 2-rank runs must reproduce, and one torchrun launch
of every check in rank_checks_runner.py."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ats_train_torchrun import (  # noqa: E402
    REFERENCE_EXTRA,
    assert_ok,
    launch,
    run_args,
    run_ats_train,
)


@pytest.fixture(scope="session")
def single_reference(overrides, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    """The single-process run (RUN_VALUES) that test_backends.py's and test_deepspeed.py's 2-rank
    runs reproduce."""
    run_dir = tmp_path_factory.mktemp("single")
    assert_ok(run_ats_train(run_args(overrides, run_dir, **REFERENCE_EXTRA), nproc=None))
    return run_dir


@pytest.fixture(scope="session")
def rank_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """{check name: result} of rank_checks_runner.py on 2 gloo ranks."""
    out = tmp_path_factory.mktemp("rank_checks") / "checks.json"
    proc = launch([str(Path(__file__).with_name("rank_checks_runner.py")), str(out)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())
