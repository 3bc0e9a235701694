"""Run plain or under torchrun by test_evaluate.py: build the trainer on RUN_DIR (which resumes
from its latest checkpoint), evaluate once, and write (rank 0) {"step", "val_loss"} to OUT_JSON.
argv: RUN_DIR OUT_JSON key=value...
"""

import json
import sys
from pathlib import Path

from ats_train.backends.process_group import exit_rank
from ats_train.build import build_trainer
from ats_train.config import load_config


def main(run_dir: str, out_json: str, overrides: list[str]) -> None:
    trainer = build_trainer(load_config(None, overrides), Path(run_dir))
    val_loss = trainer.evaluate()
    if trainer.backend.is_main:
        Path(out_json).write_text(json.dumps({"step": trainer.step, "val_loss": val_loss}))
    trainer.close()
    trainer.backend.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    exit_rank(0)  # no interpreter finalization: see process_group.exit_rank
