"""MAPPO (or IPPO) trained outside a league on a simultaneous-move game, one learner per team, and
the yardstick of what it learned: a policy's mean episode return playing every seat
(`evaluate_policy`, as the authors' code evaluates). benchmarks/mappo_spread.py runs both."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from ludus.agents.policy import ActBatch, Policy
from ludus.agents.rl.mappo import MAPPOConfig, MAPPOLearner, MAPPOStats
from ludus.agents.rl.mappo_rollout import collect_rollout, team_seats
from ludus.agents.threads import torch_threads as threads_for


@dataclass(frozen=True)
class CooperativeTrainResult:
    """Outcome of `train_cooperative`."""

    learners: dict[int, MAPPOLearner]
    """The trained learner of each team."""
    config: MAPPOConfig
    """The configuration trained with (critic_input resolved)."""
    steps: int
    """Environment steps (vector steps x games) taken."""
    seconds: float
    updates: int
    """Updates applied per team."""
    episode_returns: np.ndarray
    """[E] float32 return of every finished training episode, averaged over the seats of team 0
    (the whole team in cooperative games), in the order they ended."""
    episode_end_steps: np.ndarray
    """[E] int64 value of `steps` when each episode ended."""
    last_stats: dict[int, MAPPOStats]
    """Statistics of each team's last update."""


def train_cooperative(game_id: str, config: MAPPOConfig = MAPPOConfig(), total_steps: int = 200_000,
                      seed: int = 0, critic_input: str | None = None,
                      torch_threads: int | None = 1) -> CooperativeTrainResult:
    """MAPPO (or IPPO) on a simultaneous-move registry game, one learner per team.

    `total_steps` joint environment steps are split into rollouts of `config.num_envs` games x
    `config.num_steps` steps, each followed by one update per team. `critic_input`, when given,
    replaces `config.critic_input` ('global' = MAPPO, 'local' = IPPO).

    torch_threads: torch's intra-op threads during the call (restored after; None leaves them).
    The nets are tiny: a second thread saves nothing, and when the cores are busy torch's thread
    pool makes an update ~20x slower (measured on a loaded 2-core machine).
    """
    with threads_for(torch_threads):
        return _train_cooperative(game_id, config, total_steps, seed, critic_input)


def _train_cooperative(game_id: str, config: MAPPOConfig, total_steps: int, seed: int,
                       critic_input: str | None) -> CooperativeTrainResult:
    from ludus.games.registry import make_vector

    start = time.perf_counter()
    if critic_input is not None:
        config = dataclasses.replace(config, critic_input=critic_input)
    seed_sequence = np.random.SeedSequence(seed)
    env_seed, net_seed, act_seed = (int(s.generate_state(1)[0]) for s in seed_sequence.spawn(3))
    games = make_vector(game_id, config.num_envs, env_seed)
    spec = games.spec
    learners = {team: MAPPOLearner.for_game(spec, config, seed=net_seed + team) for team in team_seats(spec)}
    rng = np.random.default_rng(act_seed)
    steps_per_rollout = config.num_envs * config.num_steps
    num_updates = max(1, total_steps // steps_per_rollout)
    ts = games.reset(games.seed_source(config.num_envs))
    returns: list[np.ndarray] = []
    end_steps: list[np.ndarray] = []
    steps = 0
    last_stats: dict[int, MAPPOStats] = {}
    first_team = min(learners)
    for update in range(num_updates):
        if config.anneal_lr:
            for learner in learners.values():
                learner.set_learning_rate_fraction(1.0 - update / num_updates)
        rollout = collect_rollout(games, ts, learners, config.num_steps, rng, config)
        ts = rollout.timestep
        steps += rollout.env_steps
        finished = rollout.episodes.team_returns[first_team]
        returns.append(finished)
        end_steps.append(np.full(len(finished), steps, dtype=np.int64))
        last_stats = {team: learners[team].update(batch) for team, batch in rollout.batches.items()}
    return CooperativeTrainResult(
        learners=learners, config=config, steps=steps, seconds=time.perf_counter() - start,
        updates=num_updates, episode_returns=np.concatenate(returns).astype(np.float32),
        episode_end_steps=np.concatenate(end_steps), last_stats=last_stats)


@dataclass(frozen=True)
class EvaluationResult:
    """Episode returns of a policy playing every seat of a game."""

    episode_returns: np.ndarray
    """[E] float32 per episode, the mean over seats of the seats' returns."""

    @property
    def mean(self) -> float:
        return float(self.episode_returns.mean())

    @property
    def standard_error(self) -> float:
        n = len(self.episode_returns)
        return float(self.episode_returns.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


def evaluate_policy(game_id: str, policy: Policy, episodes: int, seed: int, num_envs: int = 50,
                    greedy: bool = True) -> EvaluationResult:
    """Play `episodes` episodes with `policy` (a `Policy`) acting for every seat.

    The game seeds follow from `seed` alone, so in fixed-length games (MPE) every policy is
    evaluated on the same starting positions. greedy=True is how the authors' code evaluates.
    """
    from ludus.games.registry import make_vector

    env_seed, act_seed = (int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(2))
    num_envs = min(num_envs, episodes)
    games = make_vector(game_id, num_envs, env_seed)
    rng = np.random.default_rng(act_seed)
    num_players = games.spec.num_players
    seat_ids = np.broadcast_to(np.arange(num_players), (num_envs, num_players))
    ts = games.reset(games.seed_source(num_envs))
    finished: list[np.ndarray] = []
    count = 0
    while count < episodes:
        acting = ts.acting
        actions = np.zeros((num_envs, num_players), dtype=np.int64)
        if acting.any():
            out = policy.act(ActBatch(ts.obs[acting].reshape(int(acting.sum()), -1), ts.mask[acting],
                                      seat_ids[acting]), rng, greedy=greedy)
            actions[acting] = out.actions
        ts = games.step(actions)
        if ts.done.any():
            done_returns = ts.final_returns[ts.done].mean(axis=1)
            finished.append(done_returns)
            count += len(done_returns)
    return EvaluationResult(np.concatenate(finished)[:episodes].astype(np.float32))
