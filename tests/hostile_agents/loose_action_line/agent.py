#!/usr/bin/env python3
"""Hostile executable: answers 'act' with an action line the protocol calls malformed, each of
which a lax decoder would read as the first legal action L. kind.txt beside this file says which:

    duplicate       {"type":"action","action":99,"action":L}  (json.loads keeps the last key)
    string          {"type":"action","action":"L"}
    float           {"type":"action","action":L.7}
    integral_float  {"type":"action","action":L.0}
    bool            {"type":"action","action":true}  (1 when 1 is legal)
"""
import os
import sys

LINES = {
    "duplicate": b'{"type":"action","action":99,"action":%s}\n',
    "string": b'{"type":"action","action":"%s"}\n',
    "float": b'{"type":"action","action":%s.7}\n',
    "integral_float": b'{"type":"action","action":%s.0}\n',
}
kind = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kind.txt")).read().strip()

for line in sys.stdin.buffer:
    if line.startswith(b'{"type":"hello"'):
        os.write(1, b'{"type":"ready","name":"loose_action_line"}\n')
    elif line.startswith(b'{"type":"act"'):
        legal = line.split(b'"legal_actions":[', 1)[1].split(b"]", 1)[0].split(b",")
        if kind == "bool":  # true is 1 to a lax decoder: sent only where 1 is legal
            answer = b'{"type":"action","action":true}\n' if b"1" in legal else LINES["duplicate"] % legal[0]
        else:
            answer = LINES[kind] % legal[0]
        os.write(1, answer)
    elif line.startswith(b'{"type":"shutdown"'):
        break
