"""A real `ludus arena serve` for scripts that drive the service from outside: tests, benchmarks,
an operator's smoke check. The server runs as its own `ludus` process on a free loopback port,
exactly as an operator starts it, and `ServiceProcess` speaks plain HTTP to it.

    with ServiceProcess(arena_dir, "--placement-games", "4") as server:
        status, board = server.get("/api/leaderboard")
"""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path


def run_ludus(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m ludus ARGS...` in a child process (wandb off), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "ludus", *args], capture_output=True, text=True, timeout=timeout,
                          check=check, env=dict(os.environ, WANDB_MODE="disabled"))


def agent_zip(folder: Path, extra: list[tuple[str, bytes]] = ()) -> bytes:
    """An upload archive of an agent folder (its files under `FOLDER_NAME/`), plus `extra`
    (archive name, bytes) entries as they are — hostile ones included, for tests."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for file in sorted(folder.iterdir()):
            z.write(file, f"{folder.name}/{file.name}")
        for name, data in extra:
            z.writestr(name, data)
    return buffer.getvalue()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """`ludus arena serve --arena DIR` in its own process on a free loopback port.

    `extra` are more `arena serve` options; the clock is 1 s per move with 0.5 s overage unless
    they say otherwise (the last occurrence of an option wins).
    """

    def __init__(self, arena_dir: Path, *extra: str):
        self.arena_dir = arena_dir
        self.extra = extra
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        """Start the server and wait until it answers `/api/leaderboard` (RuntimeError if it
        exits or stays silent for `timeout` seconds)."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ludus", "arena", "serve", "--arena", str(self.arena_dir), "--port", str(self.port),
             "--time-per-move", "1.0", "--overage", "0.5", *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, WANDB_MODE="disabled"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.get("/api/leaderboard")[0] == 200:
                    return self
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.process.stderr.read()[-2000:]}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not answer within {timeout:.0f} s")

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict]:
        """(HTTP status, JSON body) of one request; a body that is not JSON comes back as {"text": ...}."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        try:
            connection.request(method, path, body=body, headers=all_headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, {"text": data.decode(errors="replace")}

    def get(self, path: str) -> tuple[int, dict]:
        return self.request("GET", path)

    def upload(self, name: str, archive: bytes, token: str | None) -> tuple[int, dict]:
        """POST an agent archive as submission `name` with an account's token."""
        return self.request("POST", f"/api/submissions?name={name}", archive, token)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send `sig` and wait for the exit (a kill after 60 s without one)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
