#!/usr/bin/env python3
"""Hostile executable: answers 'act' with a line that is not JSON."""
import os
import sys

for line in sys.stdin.buffer:
    if line.startswith(b'{"type":"hello"'):
        os.write(1, b'{"type":"ready","name":"garbage_output"}\n')
    elif line.startswith(b'{"type":"act"'):
        os.write(1, b"this is not json at all\n")
    elif line.startswith(b'{"type":"shutdown"'):
        break
