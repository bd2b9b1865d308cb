"""The loop: the Trainer and what happens around its steps (cadence, progress, timing, summary, what a run
leaves), in the order a run meets them."""
