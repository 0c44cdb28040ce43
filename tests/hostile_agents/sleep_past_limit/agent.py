"""Hostile: sleeps far past any time limit."""
import time


def act(observation, legal_actions):
    time.sleep(120)
    return legal_actions[0]
