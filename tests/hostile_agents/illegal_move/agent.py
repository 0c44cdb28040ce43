"""Hostile: answers with an action that is not legal (an occupied cell) whenever there is one."""


class Agent:
    def __init__(self, num_actions):
        self.num_actions = num_actions

    def act(self, observation, legal_actions):
        illegal = [a for a in range(self.num_actions) if a not in legal_actions]
        return illegal[0] if illegal else legal_actions[0]
