#!/usr/bin/env python3
"""Hostile executable: answers every 'act', then sends the same answer again 10 ms later."""
import os
import sys
import time

for line in sys.stdin.buffer:
    if line.startswith(b'{"type":"hello"'):
        os.write(1, b'{"type":"ready","name":"late_second_answer"}\n')
    elif line.startswith(b'{"type":"act"'):
        legal = line.split(b'"legal_actions":[', 1)[1].split(b"]", 1)[0].split(b",")
        answer = b'{"type":"action","action":%s}\n' % legal[0]
        os.write(1, answer)
        time.sleep(0.01)
        os.write(1, answer)
    elif line.startswith(b'{"type":"shutdown"'):
        break
