"""What the engine and evaluation share to run a model: the device (`device.py`), the precision and its
autocast/scaler (`precision.py`), and batched inference with the headline metrics (`inference.py`).
Evaluation runs models through this package, never through the engine (trainwise.train)."""
