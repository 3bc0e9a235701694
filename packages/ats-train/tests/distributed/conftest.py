"""`dist` tests: this folder is put on sys.path so test modules can import the one launch helper
(ats_train_torchrun.py) under --import-mode=importlib."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
