#!/usr/bin/env python3
"""Plays legally; writes 'END <match id>' to stderr a few milliseconds after each 'end'."""
import json
import os
import sys
import time

for line in sys.stdin.buffer:
    message = json.loads(line)
    if message["type"] == "hello":
        os.write(1, b'{"type":"ready","name":"stderr_at_end"}\n')
    elif message["type"] == "act":
        os.write(1, b'{"type":"action","action":%d}\n' % message["legal_actions"][0])
    elif message["type"] == "end":
        time.sleep(0.005)
        os.write(2, b"END %s\n" % message["match"].encode())
    elif message["type"] == "shutdown":
        break
