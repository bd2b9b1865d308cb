"""What a label value means to every room that reads labels: the batch contract's one constant that data (which
writes labels), the losses (which skip them) and the pre-training checks in diagnose (which count them) share.
It lives in the foundation because diagnose may not import data; data/batch.py, the contract's door, uses it."""

IGNORE_INDEX = -100  # a target that carries no loss (torch's cross-entropy and transformers use it; padding)
