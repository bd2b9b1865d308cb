"""GPU and host telemetry: the sampler behind system.jsonl, its alerts, and `trainwise monitor`.

A service with no knowledge of training: the engine attaches the sampler through its own callback
(trainwise.train.callbacks.telemetry), and doctor grades cards with the same alert rules.
"""
