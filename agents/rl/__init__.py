"""Reinforcement learning (`ludus.agents.rl`): PPO, MAPPO and token-level PPO. MAPPO is three
modules: its learner (mappo), its own rollouts of a simultaneous-move game (mappo_rollout), and
the cooperative training loop with its evaluation (cooperative), which a league does not use.

Rule: import the base of `ludus.agents` (nets, policy, rollout, ppo_core, torch_policy, threads),
`ludus.agents.lm` (token PPO's model) and `ludus.games`; never the league or above.
"""
