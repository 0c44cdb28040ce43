"""Hostile: the kernel keyring as a channel between agents (keyrings(7): no namespace covers it).

At start it adds a "user" key named ``ludus-secret`` holding a note to its uid's user keyring
(add_key, KEY_SPEC_USER_KEYRING) and makes it readable by everyone (KEYCTL_SETPERM); 'KEY MADE
<serial>' or 'KEY DENIED <errno>' on stderr. At start and before every move it looks for anyone
else's: a keyring search of its user keyring by description (KEYCTL_SEARCH, what an agent later
given the same uid would do) and every key /proc/keys lists, read with KEYCTL_READ; a note that is
not its own: 'KEY FOUND <note>'. It always plays the first legal action.
"""
import ctypes
import errno
import os
import sys

NUMBERS = {"x86_64": (248, 250), "aarch64": (217, 219), "riscv64": (217, 219)}  # add_key, keyctl
KEY_SPEC_USER_KEYRING = -4
KEYCTL_SETPERM, KEYCTL_SEARCH, KEYCTL_READ = 5, 10, 11
EVERYONE = 0x3F3F3F3F  # possessor, user, group and other: view, read, write, search, link, setattr

libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = NUMBERS[os.uname().machine]


def say(text):
    print(text, file=sys.stderr, flush=True)


def failed(result):
    return errno.errorcode.get(ctypes.get_errno(), "?") if result < 0 else None


class Agent:
    def __init__(self):
        self.note = f"secret of pid {os.getpid()} {os.urandom(4).hex()}".encode()
        self.own = libc.syscall(ctypes.c_long(ADD_KEY), b"user", b"ludus-secret", self.note,
                                ctypes.c_size_t(len(self.note)), ctypes.c_long(KEY_SPEC_USER_KEYRING))
        if failed(self.own):
            say(f"KEY DENIED {failed(self.own)}")
        else:
            libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(KEYCTL_SETPERM), ctypes.c_long(self.own),
                         ctypes.c_long(EVERYONE))
            say(f"KEY MADE {self.own}")
        self._look()

    def _read(self, serial):
        buffer = ctypes.create_string_buffer(4096)
        size = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(KEYCTL_READ), ctypes.c_long(serial), buffer,
                            ctypes.c_long(4096))
        return None if size < 0 else buffer.raw[:size]

    def _look(self):
        serials = set()
        found = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(KEYCTL_SEARCH), ctypes.c_long(KEY_SPEC_USER_KEYRING),
                             b"user", b"ludus-secret", ctypes.c_long(0))
        if found > 0:
            serials.add(found)
        try:
            with open("/proc/keys") as listing:
                serials.update(int(line.split()[0], 16) for line in listing if "ludus-secret" in line)
        except OSError:
            pass
        for serial in serials:
            note = self._read(serial)
            if note and note != self.note:
                say(f"KEY FOUND {note.decode(errors='replace')}")

    def act(self, observation, legal_actions):
        self._look()
        return legal_actions[0]
