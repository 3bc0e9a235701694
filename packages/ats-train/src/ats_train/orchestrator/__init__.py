"""The adaptive orchestrator (issue 8): signals from the metrics stream and the intervention kinds
that act on the optimizer, the model and the run's settings. This package imports no torch at
import time (TrainConfig reads settings.py). Fault injection is ats_train.faults, Chinchilla
budgeting ats_train.planning."""
