#!/usr/bin/env python3
"""Hostile executable: plays one move, then closes its stdout and stays alive."""
import os
import sys
import time

moves = 0
for line in sys.stdin.buffer:
    if line.startswith(b'{"type":"hello"'):
        os.write(1, b'{"type":"ready","name":"closes_stdout"}\n')
    elif line.startswith(b'{"type":"act"'):
        moves += 1
        if moves == 2:
            os.close(1)
            print("CLOSED stdout", file=sys.stderr, flush=True)
            time.sleep(120)
        legal = line.split(b'"legal_actions":[', 1)[1].split(b"]", 1)[0]
        os.write(1, b'{"type":"action","action":%s}\n' % legal.split(b",")[0])
    elif line.startswith(b'{"type":"shutdown"'):
        break
