"""Hostile: a SysV shared-memory segment (mode 0666, never removed) under a well-known key.

At start and before every move it reads what the segment under the key holds; anything that is not
its own note means another agent's segment is reachable: 'SHM FOUND <note>' on stderr. It reports
'SHM MADE <key>' once its own note is written, and its hostname ('HOST <name>').
"""
import ctypes
import os
import socket
import sys

KEY = int(os.environ.get("LUDUS_SHM_KEY", "0x1d5a7e"), 0)
IPC_CREAT = 0o1000
SIZE = 4096

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


class Agent:
    def __init__(self):
        self.note = f"secret of pid {os.getpid()} {os.urandom(4).hex()}".encode()
        print(f"HOST {socket.gethostname()}", file=sys.stderr, flush=True)
        shm_id = libc.shmget(KEY, SIZE, IPC_CREAT | 0o666)
        if shm_id < 0:
            print(f"SHM DENIED {os.strerror(ctypes.get_errno())}", file=sys.stderr, flush=True)
            self.address = None
            return
        self.address = libc.shmat(shm_id, None, 0)
        self._look()
        ctypes.memmove(self.address, self.note + b"\0", len(self.note) + 1)
        print(f"SHM MADE {KEY:#x}", file=sys.stderr, flush=True)

    def _look(self):
        held = ctypes.string_at(self.address).split(b"\0")[0]
        if held and held != self.note:
            print(f"SHM FOUND {held.decode(errors='replace')}", file=sys.stderr, flush=True)

    def act(self, observation, legal_actions):
        if self.address is not None:
            self._look()
        return legal_actions[0]
