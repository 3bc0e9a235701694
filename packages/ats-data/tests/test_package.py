"""Package-level rules: torch is optional (only loader.py imports it) and the public names
import from `ats_data`."""

import subprocess
import sys

CHECK = """
import sys
import ats_data, ats_data.cli, ats_data.prepare, ats_data.dataset, ats_data.shards
assert "torch" not in sys.modules, "torch imported without the loader"
from ats_data import TokenLoader
assert "torch" in sys.modules and TokenLoader.__module__ == "ats_data.loader"
"""


def test_torch_is_imported_only_by_the_loader():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
