"""OpenSpiel's NFSP (the PyTorch implementation, its Leduc example's settings) for a wall-clock
budget, with the exact exploitability of its average policy: the reference printed beside a
league's poker figures (benchmarks/leduc_skill.py).

Neural Fictitious Self-Play (Heinrich & Silver 2016): each player keeps a DQN best response and a
supervised average-policy network; the average policy is what converges. Settings are those of
OpenSpiel's `examples/leduc_nfsp.py` (one hidden layer of 128, replay 2e5, reservoir 2e6,
anticipatory 0.1, batch 128, learn every 64 steps, SGD at 0.01, MSE loss, target update every
19 200 steps, epsilon 0.06 -> 0.001 over 20M steps). Measuring pauses the clock.

    python benchmarks/nfsp_reference.py --game leduc_poker --budget 600 --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def run_nfsp(game_name: str, budget: float, seed: int, eval_every: float = 60.0) -> dict:
    """Train NFSP for `budget` seconds of training time; the exploitability trace of its average policy."""
    import torch
    from open_spiel.python import policy as spiel_policy
    from open_spiel.python import rl_environment
    from open_spiel.python.algorithms import exploitability
    from open_spiel.python.pytorch import nfsp

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    np.random.seed(seed)  # the DQN's epsilon-greedy and NFSP's policy choice draw from numpy's global stream
    env = rl_environment.Environment(game_name, players=2,
                                     chance_event_sampler=rl_environment.ChanceEventSampler(seed=seed))
    info_state_size = env.observation_spec()["info_state"][0]
    num_actions = env.action_spec()["num_actions"]
    agents = [nfsp.NFSP(player, info_state_size, num_actions, [128], reservoir_buffer_capacity=int(2e6),
                        anticipatory_param=0.1, batch_size=128, rl_learning_rate=0.01, sl_learning_rate=0.01,
                        min_buffer_size_to_learn=1000, learn_every=64, optimizer_str="sgd", seed=seed * 100 + player,
                        replay_buffer_capacity=int(2e5), update_target_network_every=19_200, discount_factor=1.0,
                        epsilon_decay_duration=int(20e6), epsilon_start=0.06, epsilon_end=0.001, loss_str="mse")
              for player in range(2)]

    class AveragePolicy(spiel_policy.Policy):
        """Both players' average-policy networks as one OpenSpiel policy."""

        def __init__(self):
            super().__init__(env.game, [0, 1])
            self._obs = {"info_state": [None, None], "legal_actions": [None, None]}

        def action_probabilities(self, state, player_id=None):
            player = state.current_player()
            legal = state.legal_actions(player)
            self._obs["current_player"] = player
            self._obs["info_state"][player] = state.information_state_tensor(player)
            self._obs["legal_actions"][player] = legal
            step = rl_environment.TimeStep(observations=self._obs, rewards=None, discounts=None, step_type=None)
            with agents[player].temp_mode_as(nfsp.MODE.AVERAGE_POLICY):
                probs = agents[player].step(step, is_evaluation=True).probs
            return {a: float(probs[a]) for a in legal}

    average = AveragePolicy()
    trace, train_seconds, episodes, last_eval = [], 0.0, 0, 0.0
    while train_seconds < budget:
        start = time.perf_counter()
        for _ in range(1000):
            step = env.reset()
            while not step.last():
                player = step.observations["current_player"]
                step = env.step([agents[player].step(step).action])
            for agent in agents:
                agent.step(step)
        episodes += 1000
        train_seconds += time.perf_counter() - start
        if train_seconds - last_eval >= eval_every or train_seconds >= budget:
            trace.append({"train_seconds": round(train_seconds, 1), "episodes": episodes,
                          "exploitability": float(exploitability.exploitability(env.game, average))})
            last_eval = train_seconds
    return {"game": game_name, "seed": seed, "budget": budget, "episodes": episodes, "trace": trace,
            "final": trace[-1]["exploitability"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="leduc_poker", help="OpenSpiel game name")
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=float, default=60.0)
    args = parser.parse_args(argv)
    json.dump(run_nfsp(args.game, args.budget, args.seed, args.eval_every), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
