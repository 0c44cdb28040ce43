"""Hostile: never returns from its first move (burns CPU)."""


def act(observation, legal_actions):
    while True:
        pass
