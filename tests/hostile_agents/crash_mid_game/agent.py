"""Hostile: plays one legal move, then raises."""


class Agent:
    def __init__(self):
        self.moves = 0

    def act(self, observation, legal_actions):
        self.moves += 1
        if self.moves >= 2:
            raise RuntimeError("hostile crash mid-game")
        return legal_actions[0]
