"""Stop cleanly on cloud preemption (SIGTERM, SIGUSR1) and Ctrl-C: finish the optimizer step, checkpoint,
exit. A second Ctrl-C aborts at once."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable

_SIGNALS = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])


class GracefulStop:
    """While active, the first signal only sets `requested`; the loop checks it between optimizer steps."""

    def __init__(self, on_request: Callable[[str], None] | None = None):
        self.requested: str | None = None
        self._on_request = on_request
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now, no checkpoint
        if self.requested is None:
            self.requested = name
            if self._on_request:
                self._on_request(name)
