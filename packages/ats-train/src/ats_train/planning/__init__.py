"""Sizing a run by a compute law: Chinchilla budgeting (chinchilla.py), TrainConfig [plan]
(settings.py) and `ats-train plan` (plan_cli.py)."""
