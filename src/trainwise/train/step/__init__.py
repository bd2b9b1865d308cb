"""One training step (TrainStep, defined once) and what it owns: the state, optimizer, schedule, master
weights, the non-finite probe."""
