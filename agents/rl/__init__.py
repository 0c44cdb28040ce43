"""Reinforcement learning (`ludus.agents.rl`): PPO, MAPPO and token-level PPO.

Rule: import the base of `ludus.agents` (nets, policy, rollout, ppo_core, torch_policy, threads),
`ludus.agents.lm` (token PPO's model) and `ludus.games`; never the league or above.
"""
