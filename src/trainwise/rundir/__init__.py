"""Foundation: everything that knows a run directory. `layout.py` (RunDir) is the one module that spells
the file names inside one; the others serve it: atomic writes (`atomic.py`), the writer's lock (`lock.py`),
what readers make of the status (`status.py`), checksums (`integrity.py`), trust in foreign runs
(`trust.py`), the JSONL records (`records.py`), the final weights' format (`weights_format.py`) and the
weights evaluation reads (`weights.py`), a LoRA run's adapter (`adapter.py`), checkpoint files and sharded
checkpoint directories (`checkpoint_files.py`, `checkpoint_dirs.py`), and what --overwrite may replace
(`replace.py`). It imports no room."""
from trainwise.rundir.layout import RunDir

__all__ = ["RunDir"]
