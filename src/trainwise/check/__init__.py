"""Probes that run a training step to learn something before (or beside) a run: the sanity checks and the
overfit-one-batch probe (`trainwise check`), the LR range test (`trainwise lr-find`), and the model's
samples/s for `trainwise data bench`. They stand on the engine; the rules that judge what they measure are
pure and live in trainwise.diagnose."""
