"""Fine-tuning part of a model: which parameters train (trainable.py), the [lora] section
(settings.py), the adapter a run exports (export.py) and `ats-train merge-adapter` (merge_cli.py)."""
