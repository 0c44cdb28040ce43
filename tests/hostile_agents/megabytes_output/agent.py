#!/usr/bin/env python3
"""Hostile executable: answers 'act' with 4 MiB of output and no newline."""
import os
import sys

for line in sys.stdin.buffer:
    if line.startswith(b'{"type":"hello"'):
        os.write(1, b'{"type":"ready","name":"megabytes_output"}\n')
    elif line.startswith(b'{"type":"act"'):
        chunk = b"A" * 65536
        try:
            for _ in range(64):
                os.write(1, chunk)
        except BrokenPipeError:
            break
    elif line.startswith(b'{"type":"shutdown"'):
        break
