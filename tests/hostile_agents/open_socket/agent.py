"""Hostile: tries to reach the network, on loopback only (127.0.0.1; port from LUDUS_PROBE_PORT).

Reports on stderr 'SOCKET <what>: connected' or 'SOCKET <what>: denied (...)', and lists the
network interfaces it can see.
"""
import os
import socket
import sys


def report(what, fn):
    try:
        fn()
        print(f"SOCKET {what}: connected", file=sys.stderr, flush=True)
    except OSError as exc:
        print(f"SOCKET {what}: denied ({type(exc).__name__}: {exc.strerror})", file=sys.stderr, flush=True)


def tcp(port):
    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
        s.sendall(b"hostile")


def udp(port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"hostile", ("127.0.0.1", port))


def own_loopback():
    """Even its own listener on 127.0.0.1 is unreachable: loopback is down in its namespace."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=0.2):
            pass


class Agent:
    def __init__(self):
        port = int(os.environ.get("LUDUS_PROBE_PORT", "9"))
        report(f"tcp 127.0.0.1:{port}", lambda: tcp(port))
        report(f"udp 127.0.0.1:{port}", lambda: udp(port))
        report("tcp to its own listener on 127.0.0.1", own_loopback)
        print(f"INTERFACES {sorted(os.listdir('/sys/class/net'))}", file=sys.stderr, flush=True)

    def act(self, observation, legal_actions):
        return legal_actions[0]
