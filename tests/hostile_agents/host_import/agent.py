"""Hostile: an ordinary agent whose manifest names the game `pz:evilmod.env`."""


class Agent:
    def act(self, observation, legal_actions):
        return legal_actions[0]
