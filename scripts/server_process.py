"""`python -m pyllama_so.server` (or upstream's llama-server) as a subprocess on a free port, for the server's
tests and the scripts beside this file (server-scenario, server-load). Imports nothing of pyllama_so: a CUDA
context in the measuring process would count in a script's peak VRAM (vram_peak.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

OURS = [sys.executable, "-m", "pyllama_so.server"]


class ServerProcess:
    """`COMMAND --port 0 ARGS`, COMMAND by default `python -m pyllama_so.server` (llama-server's path for
    upstream's: both log a "listening on URL" line once they serve, and answer /health): url comes from that
    line, and the constructor returns once /health answers 200 within start_timeout (or stops the server and
    raises RuntimeError). lines holds its log (stdout and stderr, read as it comes so the pipe never fills):
    a line the server writes reaches it a little later (wait_for_log), and all of it once stop() returns.
    stop() terminates it, killing it after 20 s."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, start_timeout: float = 120,
                 command: list[str] | None = None) -> None:
        self.lines: list[str] = []
        self.url = ""
        self.command = [*(command or OURS), "--port", "0", *args]
        self._ready = threading.Event()
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", env={**os.environ, **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            if not self._ready.wait(start_timeout) or not self.url:
                raise RuntimeError(f"the server did not start:\n{self.log}")
            deadline = time.monotonic() + max(30.0, start_timeout)
            while not self._healthy():
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"/health never answered 200:\n{self.log}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()  # it exited

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError):  # the socket is bound before uvicorn listens
            return False

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_log(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """The first match of the regular expression pattern in the log, once the line has come through the
        pipe; the deadline only guards against a hang (AssertionError with the log)."""
        deadline = time.monotonic() + timeout
        while (m := re.search(pattern, self.log)) is None:
            assert time.monotonic() < deadline and self._reader.is_alive(), f"no {pattern!r} in the log:\n{self.log}"
            time.sleep(0.02)
        return m

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: a clean shutdown, requests in progress get 5 s
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(20)  # the log's last lines (the pipe ends with the process and any child holding it)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
