"""Arena (`ludus.arena`): sandboxed tournaments between submitted agents, a rated leaderboard, a web service.

Rule: imports `ludus.league` (its ledger and ratings), `ludus.agents`, `ludus.games` and the
shared `ludus` modules; never `ludus.evaluation` (tests/test_layering.py).

`ludus.arena.sandbox` is how an agent's process is isolated and watched (process, isolation,
cgroups, and sandbox_init.py, the script that builds the agent's namespaces and root). The agent's
side of the conversation (agent_host, run as `python -m ludus.arena.agent_host`) and the protocol
stay in `ludus.arena`.
"""
