"""Language models (`ludus.agents.lm`): the model and its generation, the KV cache, pretrained bases,
the text policy and the LM learners' compute (text PPO, text MMD, text ExIt).

Rule: import the base of `ludus.agents`, `ludus.agents.solvers` (MMD's update) and `ludus.games`;
never `ludus.agents.rl` or `bots`, never the league or above.
"""
