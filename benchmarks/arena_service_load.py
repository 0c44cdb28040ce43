"""The arena service under load: 50 clients reading the leaderboard while 5 accounts upload, for 60 s.

Starts `ludus arena serve` on a loopback port (scheduler on: two bots and the uploads keep it
playing), then at the same time:

* 50 readers (5 processes x 10 threads, one keep-alive connection each) fetch `/api/leaderboard`
  in a loop and record every request's latency;
* 5 uploaders, one account each, upload the example Python agent again and again (each upload is
  unpacked, validated in the sandbox and entered as a new version).

Afterwards: every upload answered 201 must be an entrant in the ledger (no lost submission), and
no request may have failed (any status other than 200 for reads and 201 for uploads, or a
connection error, counts as an error). Prints latency percentiles of the reads.

    python benchmarks/arena_service_load.py [--seconds 60] [--readers 50] [--uploaders 5]

Ends with ``goal arena_read_p99_ms: <p99 read latency> (target 100) PASS|FAIL`` (FAIL also when
anything failed or got lost).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_MS = 100.0
REPO = Path(__file__).resolve().parents[1]


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
    args = parser.parse_args(argv)

    import numpy as np

    from league.ledger import Store
    from arena.testing import ServiceProcess, agent_zip, run_ludus

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
            latencies, errors = [], []
            for _ in processes:
                got, bad = queue.get(timeout=args.seconds + 120)
                latencies.extend(got)
                errors.extend(bad)
            for p in processes:
                p.join()
            for t in uploaders:
                t.join()
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
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    passed = p99 <= TARGET_MS and not errors and not upload_errors and not lost
    print(f"goal arena_read_p99_ms: {p99:.1f} (target {TARGET_MS:.0f}) {'PASS' if passed else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
