"""A uniformly random agent: the smallest honest Python-folder submission.

`ludus.arena.agent_host` builds `Agent()` once per process and calls `act` for every move. Taking `rng`
(a numpy Generator seeded from the match seed) makes a match replay exactly from its seed.
"""


class Agent:
    def act(self, observation, legal_actions, rng):
        return int(rng.choice(legal_actions))
