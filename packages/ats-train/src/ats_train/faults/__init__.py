"""Fault injection from TrainConfig [faults] (settings.py), applied to a real run by inject.py:
the drills that prove each orchestrator kind reacts to the condition it exists for."""
