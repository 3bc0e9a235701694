"""The adaptive orchestrator (issue 8): signals from the metrics stream, intervention kinds that act on
the optimizer, the model and the run's settings, fault injection that proves each kind, and
Chinchilla budgeting. This package imports no torch at import time (TrainConfig reads settings.py).
"""
