"""The loop's hook points (base.py) and the callbacks every run has: telemetry, live diagnosis, early stopping,
the validation guard, language-model rates."""
