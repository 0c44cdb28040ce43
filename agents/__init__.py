"""Agents (`ludus.agents`): policies and the compute that trains them, below the league.

Rule: imports `ludus.games` and the shared `ludus` modules (errors, text, bounds, files), never
the league, arena or evaluation (tests/test_layering.py).

* the base: the `Policy` protocol (policy), nets, rollout, ppo_core, torch_policy, kernels (with
  grouped_linear.cpp), the snapshot format (snapshot), mixtures, the optimizer backends
  (deepspeed_backend, data_parallel), threads, check, export, play, cli;
* `ludus.agents.rl`: PPO, MAPPO (its learner and cooperative training loop), token-level PPO;
* `ludus.agents.solvers`: Deep CFR, MMD, exact exploitability;
* `ludus.agents.lm`: language models (the model, generation, the prompt cache, the split trunk, the
  KV cache, pretrained bases, the text policy, the LM learners' compute);
* `ludus.agents.bots`: reference bots (`builtin`: random, MCTS, perfect tic-tac-toe, scripted),
  connect four's compiled MCTS, MPE's scripted policies, scripted negotiators.

The sub-packages build on the base. The snapshot format reaches the kinds' loaders through one
table (`ludus.agents.snapshot.SNAPSHOT_KINDS`; the language models' kinds, saved and loaded in
`ludus.agents.lm.snapshots`, by module path). Where the base still reaches up into one (mixtures
and play build bots; the optimizer backends serve PPO and token PPO) the import is lazy, inside a
function.
"""
