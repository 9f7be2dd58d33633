"""A daemon thread that runs one step on an interval: the local scheduler, console and workload."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Loop:
    """Runs `tick` every `interval` seconds until stopped. A tick that raises is handed to `on_error` and
    the loop goes on: a failed step of the local stack must not stop the control plane."""

    def __init__(
        self, name: str, interval: float, tick: Callable[[], Any], on_error: Callable[[Exception], None]
    ) -> None:
        self._name = name
        self._interval = interval
        self._tick = tick
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:
                # A step cut short by the stack stopping under it is no failure worth a traceback.
                if not self._stop.is_set():
                    self._on_error(exc)
            self._stop.wait(self._interval)
