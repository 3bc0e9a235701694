"""Test-only entry point: `ats-train` with every checkpoint file write slowed down.

python checkpoint_delay_runner.py SECONDS [ats-train args...] sleeps SECONDS before hashing each
file of a checkpoint, so a test can SIGKILL the process while a checkpoint is half written. The
production code has no such hook; this file patches it from outside.
"""

import sys
import time

from ats_train import checkpoint
from ats_train.cli import main

delay = float(sys.argv[1])
hash_and_sync = checkpoint._hash_and_sync


def slow_hash_and_sync(path):  # noqa: ANN001, ANN201
    time.sleep(delay)
    return hash_and_sync(path)


checkpoint._hash_and_sync = slow_hash_and_sync
sys.exit(main(sys.argv[2:]))
