"""The sandbox (`ludus.arena.sandbox`): the process an agent runs in, its isolation and its limits.

Rule: import `ludus.arena.protocol` and `ludus.errors` only; sandbox_init.py imports nothing of
Ludus at all (it runs as a script, `python -I -S`, before the agent's root exists).
"""
