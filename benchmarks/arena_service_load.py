"""The arena service under load: 50 clients reading the leaderboard while 5 accounts upload and a
slowloris client holds 200 half-open connections, for 60 s.

Starts `ludus arena serve` on a loopback port (scheduler on: two bots and the uploads keep it
playing), then at the same time:

* 50 readers (5 processes x 10 threads, one keep-alive connection each) fetch `/api/leaderboard`
  in a loop and record every request's latency;
* 5 uploaders, one account each, upload the example Python agent again and again (each upload is
  unpacked, validated in the sandbox and entered as a new version);
* a slowloris client (one process) keeps 200 connections open, each sending a request's first
  line and then one more header line a second, never finishing; when the server closes one (its
  header deadline, `ServiceConfig.header_timeout_s`, 10 s) it opens another at once.

Afterwards: every upload answered 201 must be an entrant in the ledger (no lost submission), and
no request may have failed (any status other than 200 for reads and 201 for uploads, or a
connection error, counts as an error), and no slowloris connection may be held past the header
deadline (plus 3 s of slack for a loaded machine). Prints latency percentiles of the reads and how
long the server held the slowloris connections.

    python benchmarks/arena_service_load.py [--seconds 60] [--readers 50] [--uploaders 5] [--slowloris 200]

Ends with ``goal arena_read_p99_ms: <p99 read latency> (target 100) PASS|FAIL`` (FAIL also when
anything failed or got lost).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import selectors
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_MS = 100.0
REPO = Path(__file__).resolve().parents[1]
HEADER_TIMEOUT_S = 10.0
"""The service's default header deadline (`ludus.arena.service.ServiceConfig.header_timeout_s`)."""
SLACK_S = 3.0


def _slowloris_process(port: int, connections: int, until: float, out) -> None:
    """Hold `connections` connections that never finish their headers, until `until`; report how
    many were opened, how long the server held each one it closed, and the connect errors."""
    selector = selectors.DefaultSelector()
    opened, held, connect_errors = 0, [], 0

    def open_one() -> None:
        nonlocal opened, connect_errors
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /api/leaderboard HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        except OSError:
            connect_errors += 1
            return
        sock.setblocking(False)
        opened += 1
        selector.register(sock, selectors.EVENT_READ, time.monotonic())

    def drop(key, closed_by_server: bool) -> None:
        selector.unregister(key.fileobj)
        key.fileobj.close()
        if closed_by_server:
            held.append(time.monotonic() - key.data)

    for _ in range(connections):
        open_one()
    next_line = time.monotonic() + 1.0
    while time.time() < until:
        for key, _ in selector.select(timeout=max(0.0, next_line - time.monotonic())):
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data or data.startswith(b"HTTP/"):  # the 408, then the close: gone either way
                drop(key, closed_by_server=True)
        if time.monotonic() >= next_line:  # one more header line on each, never the blank line
            for key in list(selector.get_map().values()):
                try:
                    key.fileobj.send(b"X-Slow: 1\r\n")
                except OSError:
                    drop(key, closed_by_server=True)
            next_line += 1.0
        while len(selector.get_map()) < connections and time.time() < until:
            open_one()
            if connect_errors > 10 * connections:
                break
    still_open = [time.monotonic() - key.data for key in selector.get_map().values()]
    for key in list(selector.get_map().values()):
        drop(key, closed_by_server=False)
    out.put((opened, held, still_open, connect_errors))


def _reader_process(port: int, threads: int, until: float, out) -> None:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def read() -> None:
        mine, bad = [], []
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.time() < until:
            start = time.perf_counter()
            try:
                connection.request("GET", "/api/leaderboard")
                response = connection.getresponse()
                body = response.read()
                if response.status != 200 or not body.startswith(b"{"):
                    bad.append(f"status {response.status}")
            except (OSError, http.client.HTTPException) as exc:
                bad.append(type(exc).__name__)
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            mine.append(time.perf_counter() - start)
        connection.close()
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    workers = [threading.Thread(target=read) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put((latencies, errors))


def _uploader(port: int, token: str, name: str, archive: bytes, until: float, results: list) -> None:
    while time.time() < until:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            connection.request("POST", f"/api/submissions?name={name}", body=archive,
                               headers={"Authorization": f"Bearer {token}"})
            response = connection.getresponse()
            results.append((response.status, json.loads(response.read())))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            results.append((0, {"error": type(exc).__name__}))
        finally:
            connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--uploaders", type=int, default=5)
    parser.add_argument("--slowloris", type=int, default=200, help="half-open connections held meanwhile")
    args = parser.parse_args(argv)

    import numpy as np

    from ludus.league.records.ledger import Store
    from ludus.arena.testing import ServiceProcess, agent_zip, run_ludus

    archive = agent_zip(REPO / "examples" / "agents" / "random_python")
    with tempfile.TemporaryDirectory(prefix="ludus-arena-load-") as tmp:
        arena_dir = Path(tmp) / "arena"
        tokens = []
        for k in range(args.uploaders):
            extra = ["--game", "tic_tac_toe"] if k == 0 else []
            tokens.append(run_ludus("arena", "token", "add", f"user{k}", *extra, "--arena", str(arena_dir)).stdout.split()[-1])
        run_ludus("arena", "submit", "bot:random", "--arena", str(arena_dir))
        run_ludus("arena", "submit", "bot:mcts-10", "--arena", str(arena_dir))
        server = ServiceProcess(arena_dir, "--uploads-per-hour", "100000").start()
        try:
            until = time.time() + args.seconds
            queue: multiprocessing.Queue = multiprocessing.Queue()
            per_process = max(1, args.readers // 5)
            processes = [multiprocessing.Process(target=_reader_process, args=(server.port, per_process, until, queue))
                         for _ in range((args.readers + per_process - 1) // per_process)]
            for p in processes:
                p.start()
            uploads: list = []
            uploaders = [threading.Thread(target=_uploader, args=(server.port, token, f"agent{k}", archive, until, uploads))
                         for k, token in enumerate(tokens)]
            for t in uploaders:
                t.start()
            slow_queue: multiprocessing.Queue = multiprocessing.Queue()
            slowloris = multiprocessing.Process(target=_slowloris_process,
                                                args=(server.port, args.slowloris, until, slow_queue))
            if args.slowloris:
                slowloris.start()
            latencies, errors = [], []
            for _ in processes:
                got, bad = queue.get(timeout=args.seconds + 120)
                latencies.extend(got)
                errors.extend(bad)
            for p in processes:
                p.join()
            for t in uploaders:
                t.join()
            opened, held, still_open, connect_errors = (slow_queue.get(timeout=120) if args.slowloris
                                                        else (0, [], [], 0))
            if args.slowloris:
                slowloris.join()
            matches = server.get("/api/leaderboard")[1]["total_matches"]
        finally:
            server.stop()
        with Store.open(arena_dir, mode="read") as store:
            entered = {p.player_id for p in store.players()}
    accepted = [body["player_id"] for status, body in uploads if status == 201]
    upload_errors = [(status, body.get("error")) for status, body in uploads if status != 201]
    lost = [pid for pid in accepted if pid not in entered]
    ms = 1000 * np.array(latencies)
    p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
    print(f"{len(latencies):,} leaderboard reads by {args.readers} clients in {args.seconds:.0f} s "
          f"({len(latencies) / args.seconds:,.0f}/s): p50 {p50:.1f} ms, p90 {np.percentile(ms, 90):.1f} ms, "
          f"p99 {p99:.1f} ms, max {ms.max():.1f} ms; read errors {len(errors)}")
    print(f"uploads by {args.uploaders} accounts: {len(accepted)} accepted, {len(upload_errors)} not "
          f"({upload_errors[:3]}); lost submissions {len(lost)}; matches recorded meanwhile {matches}")
    limit = HEADER_TIMEOUT_S + SLACK_S
    overheld = [s for s in held + still_open if s > limit]
    if args.slowloris:
        times = np.array(held or [0.0])
        print(f"slowloris: {args.slowloris} half-open connections held beside the readers: {opened} opened, "
              f"{len(held)} closed by the server after p50 {np.percentile(times, 50):.1f} s, max {times.max():.1f} s "
              f"(header deadline {HEADER_TIMEOUT_S:.0f} s); {len(overheld)} held past {limit:.0f} s; "
              f"connect errors {connect_errors}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    passed = (p99 <= TARGET_MS and not errors and not upload_errors and not lost and not overheld
              and not connect_errors and (not args.slowloris or bool(held)))
    print(f"goal arena_read_p99_ms: {p99:.1f} (target {TARGET_MS:.0f}) {'PASS' if passed else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
