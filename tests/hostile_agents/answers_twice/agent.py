#!/usr/bin/env python3
"""Hostile executable: answers every 'act' with two (legal) actions in one write."""
import os
import sys

for line in sys.stdin.buffer:
    if line.startswith(b'{"type":"hello"'):
        os.write(1, b'{"type":"ready","name":"answers_twice"}\n')
    elif line.startswith(b'{"type":"act"'):
        legal = line.split(b'"legal_actions":[', 1)[1].split(b"]", 1)[0].split(b",")
        answer = b'{"type":"action","action":%s}\n' % legal[0]
        os.write(1, answer + answer)
    elif line.startswith(b'{"type":"shutdown"'):
        break
