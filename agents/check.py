"""`check_policy`: does a policy keep the Ludus policy protocol? (Next to games/check.py's
`check_game`, in the spirit of PettingZoo's api_test.)

It plays seeded games of a registered game with the policy in every seat and asserts, with a
message naming the seed and step:

* `act` returns one action, log-prob and value per row, of the documented dtypes;
* every action is legal under the row's mask, log-probs are finite and <= 0, values finite;
* the same batch and the same RNG seed give the same output (runners replay matches exactly);
* greedy play is legal and replays from the same seed too;
* the batch handed to `act` is not modified (runners reuse its arrays);
* a policy with `needs_history` gets the histories and a policy without does not need them;
* a policy with `needs_critic_input` (a MAPPO side) gets each row's centralised critic input as
  runners record it (`ludus.agents.rollout.side_critic_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ludus.agents.policy import ActBatch, ActOutput, Policy
from ludus.agents.rollout import side_critic_inputs
from ludus.games import registry
from ludus.games.core import is_over


class PolicyCheckError(AssertionError):
    """The policy breaks the protocol; the message says where and how."""


@dataclass(frozen=True)
class PolicyCheckReport:
    game_id: str
    games: int
    act_calls: int
    rows: int


def check_policy(policy: Policy, game_id: str, num_games: int = 4, seed: int = 0,
                 max_steps: int = 400) -> PolicyCheckReport:
    """Play `num_games` seeded games of `game_id` with `policy` in every seat; raise
    `PolicyCheckError` at the first broken promise."""
    spec = registry.spec(game_id)
    calls = rows = 0
    for g in range(num_games):
        game = registry.make(game_id)
        game.reset(seed + g)
        for step in range(max_steps):
            if is_over(game):
                break
            actions = {}
            critic = None
            if getattr(policy, "needs_critic_input", False):
                everyone = np.stack([game.observation(s) for s in range(spec.num_players)])[None]
                state = game.global_state()[None] if spec.state_shape is not None else None
                critic = side_critic_inputs(everyone, state, spec.team_of_seat)[0]
            for seat in game.to_move():
                batch = ActBatch(obs=game.observation(seat)[None].copy(), mask=game.legal_mask(seat)[None].copy(),
                                 seats=np.array([seat], np.int64),
                                 histories=[game.history()] if policy.needs_history else None,
                                 critic_obs=None if critic is None else critic[seat][None].copy())
                where = f"{game_id} seed {seed + g} step {step} seat {seat}"
                out = _checked_act(policy, batch, spec.num_actions, where, seed * 7919 + step)
                actions[seat] = int(out.actions[0])
                calls, rows = calls + 1, rows + 1
            game.step(actions)
    return PolicyCheckReport(game_id, num_games, calls, rows)


def _checked_act(policy: Policy, batch: ActBatch, num_actions: int, where: str, rng_seed: int) -> ActOutput:
    before = (batch.obs.copy(), batch.mask.copy())
    out = policy.act(batch, np.random.default_rng(rng_seed))
    if not (np.array_equal(batch.obs, before[0]) and np.array_equal(batch.mask, before[1])):
        raise PolicyCheckError(f"{where}: act() modified the batch it was given")
    n = len(batch)
    for name in ("actions", "log_probs", "values"):
        value = np.asarray(getattr(out, name))
        if value.shape != (n,):
            raise PolicyCheckError(f"{where}: {name} has shape {value.shape}, expected ({n},)")
    actions = np.asarray(out.actions)
    if not np.issubdtype(actions.dtype, np.integer):
        raise PolicyCheckError(f"{where}: actions are {actions.dtype}, expected integers")
    if ((actions < 0) | (actions >= num_actions)).any() or not batch.mask[np.arange(n), actions].all():
        raise PolicyCheckError(f"{where}: illegal action {actions.tolist()} under mask {batch.mask.astype(int).tolist()}")
    logprobs, values = np.asarray(out.log_probs, np.float64), np.asarray(out.values, np.float64)
    if not np.isfinite(logprobs).all() or (logprobs > 1e-6).any():
        raise PolicyCheckError(f"{where}: log-probs {logprobs.tolist()} are not finite and <= 0")
    if not np.isfinite(values).all():
        raise PolicyCheckError(f"{where}: values {values.tolist()} are not finite")
    again = policy.act(batch, np.random.default_rng(rng_seed))
    if not np.array_equal(np.asarray(again.actions), actions):
        raise PolicyCheckError(f"{where}: the same batch and RNG seed gave actions {actions.tolist()} and "
                               f"{np.asarray(again.actions).tolist()}: play would not replay")
    # Greedy play (evaluation) must be legal and replayable too. Its RNG may still break ties:
    # the random bot's 'most likely action' is any legal one.
    greedy = [np.asarray(policy.act(batch, np.random.default_rng(rng_seed), greedy=True).actions) for _ in range(2)]
    if not batch.mask[np.arange(n), greedy[0]].all() or not np.array_equal(greedy[0], greedy[1]):
        raise PolicyCheckError(f"{where}: greedy actions {greedy[0].tolist()} and {greedy[1].tolist()} from the "
                               f"same seed are not both the same legal actions")
    together = getattr(policy, "act_together", None)
    if together is not None:  # the ActsTogether promise: what act() in turn would give and draw
        rng_together, rng_in_turn = np.random.default_rng(rng_seed), np.random.default_rng(rng_seed)
        outputs = together([(policy, batch, False), (policy, batch, True)], rng_together)
        in_turn = [policy.act(batch, rng_in_turn), policy.act(batch, rng_in_turn, greedy=True)]
        for got, expected in zip(outputs, in_turn):
            if not np.array_equal(np.asarray(got.actions), np.asarray(expected.actions)) or not np.allclose(
                    got.log_probs, expected.log_probs, atol=0.05):
                raise PolicyCheckError(f"{where}: act_together gave actions {np.asarray(got.actions).tolist()} "
                                       f"(log-probs {np.asarray(got.log_probs).tolist()}) where act() gave "
                                       f"{np.asarray(expected.actions).tolist()} ({np.asarray(expected.log_probs).tolist()})")
        if rng_together.random() != rng_in_turn.random():
            raise PolicyCheckError(f"{where}: act_together drew from the Generator differently from act() in turn")
    return out
