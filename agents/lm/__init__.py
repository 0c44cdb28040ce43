"""Language models (`ludus.agents.lm`), one idea a module: the model with its value head and
snapshot files (model), acting and generating (generation), prompts read once and shared
(prompt_cache), a trunk cut at a frozen layer (split_trunk), the KV cache, pretrained bases and
their adapters (pretrained), the text policy and the LM learners' compute (text PPO, text MMD,
text ExIt).

Within the family the arrows point one way: model <- pretrained <- prompt_cache <- generation <-
text_policy and the learners' compute.

Rule: import the base of `ludus.agents`, `ludus.agents.solvers` (MMD's update) and `ludus.games`;
never `ludus.agents.rl` or `bots`, never the league or above.
"""
