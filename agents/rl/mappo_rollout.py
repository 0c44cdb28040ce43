"""MAPPO's own rollouts: a simultaneous-move `VectorGame` played by each team's shared actor for T
steps, one `MAPPOBatch` per team (the learner is agents/rl/mappo.py). In a league the runners
record the rows instead (league/learners/mappo.py); this collector serves the cooperative
training loop (agents/rl/cooperative.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ludus.agents.policy import ActBatch
from ludus.agents.rl.mappo import MAPPOBatch, MAPPOConfig, MAPPOLearner, actor_inputs, critic_inputs, input_sizes
from ludus.agents.rollout import compute_gae
from ludus.games.core import GameError, GameSpec, TimeStep, VectorGame


def team_seats(spec: GameSpec) -> dict[int, np.ndarray]:
    """Seats of each team id, in seat order."""
    teams = np.asarray(spec.team_of_seat)
    return {int(team): np.flatnonzero(teams == team) for team in np.unique(teams)}


@dataclass(frozen=True)
class EpisodeRecord:
    """Episodes that ended during a rollout."""

    team_returns: dict[int, np.ndarray]
    """Per team, [E] mean over the team's seats of each finished episode's return."""
    lengths: np.ndarray
    """[E] steps of each finished episode."""


@dataclass(frozen=True)
class Rollout:
    """What `collect_rollout` returns."""

    batches: dict[int, MAPPOBatch]
    """The training batch of each team."""
    timestep: TimeStep
    """The TimeStep to continue from."""
    episodes: EpisodeRecord
    env_steps: int
    """Vector-game steps taken times the number of games (joint steps, not per agent)."""


def _critic_input_now(games: VectorGame, ts: TimeStep, config: MAPPOConfig) -> np.ndarray:
    """Critic inputs for `ts`, the TimeStep of the games now running in `games`."""
    state = None
    if config.critic_input == "global" and games.spec.state_shape is not None:
        state = games.global_states()
    return critic_inputs(ts.obs, state, config, games.spec.team_of_seat)


def collect_rollout(games: VectorGame, ts: TimeStep, learners: dict[int, MAPPOLearner], num_steps: int,
                    rng: np.random.Generator, config: MAPPOConfig) -> Rollout:
    """Play `num_steps` steps of a simultaneous-move vector game with each team's shared actor.

    Layout [T, B, P]: every (step, slot, seat) is a row; `active` is `ts.acting`. The reward of
    row (t, b, p) is what seat p received in step t. GAE runs per (slot, seat) with
    `compute_gae`; a row's sequence ends (`done`) when its game ends or its seat stops acting.
    Terminal ends and seats leaving bootstrap 0; a truncation (step limit, e.g. MPE's
    max_cycles) is not an end by the rules and bootstraps from the seat's last value estimate,
    as ludus.agents.rollout does (with auto-reset the final state is gone). The last step bootstraps
    from the critic's value of the state the rollout stops in.
    """
    spec = games.spec
    if not spec.simultaneous and spec.num_players > 1:
        raise GameError(f"collect_rollout plays simultaneous-move games; {spec.id} is turn-based")
    num_games, num_players = games.num_games, spec.num_players
    seats_of_team = team_seats(spec)
    if set(learners) != set(seats_of_team):
        raise ValueError(f"learners for teams {sorted(learners)} but {spec.id} has teams {sorted(seats_of_team)}")
    team_of_seat = np.asarray(spec.team_of_seat)
    actor_size, critic_size = input_sizes(spec, config)
    shape = (num_steps, num_games, num_players)
    actor_obs = np.zeros((*shape, actor_size), dtype=np.float32)
    critic_obs = np.zeros((*shape, critic_size), dtype=np.float32)
    masks = np.ones((*shape, spec.num_actions), dtype=bool)
    actions = np.zeros(shape, dtype=np.int64)
    logprobs = np.zeros(shape, dtype=np.float32)
    values = np.zeros(shape, dtype=np.float32)
    rewards = np.zeros(shape, dtype=np.float32)
    active = np.zeros(shape, dtype=bool)
    game_done = np.zeros((num_steps, num_games), dtype=bool)
    game_truncated = np.zeros((num_steps, num_games), dtype=bool)
    finished_returns: dict[int, list[np.ndarray]] = {team: [] for team in seats_of_team}
    finished_lengths: list[np.ndarray] = []
    seat_ids = np.broadcast_to(np.arange(num_players), (num_games, num_players))

    for t in range(num_steps):
        acting = ts.acting
        actor_now = actor_inputs(ts.obs, config)
        critic_now = _critic_input_now(games, ts, config)
        step_actions = np.zeros((num_games, num_players), dtype=np.int64)
        for team, learner in learners.items():
            rows = acting & (team_of_seat == team)[None, :]
            if not rows.any():
                continue
            out = learner.policy(num_players).act(
                ActBatch(ts.obs[rows].reshape(int(rows.sum()), -1), ts.mask[rows], seat_ids[rows]), rng)
            step_actions[rows] = out.actions
            logprobs[t][rows] = out.log_probs
            values[t][rows] = learner.values(critic_now[rows])
        actor_obs[t], critic_obs[t] = actor_now, critic_now
        masks[t][acting] = ts.mask[acting]
        actions[t], active[t] = step_actions, acting
        ts = games.step(step_actions)
        rewards[t] = np.where(acting, ts.rewards, 0.0)
        game_done[t], game_truncated[t] = ts.done, ts.truncated
        if ts.done.any():
            for team, seats in seats_of_team.items():
                finished_returns[team].append(ts.final_returns[ts.done][:, seats].mean(axis=1))
            finished_lengths.append(ts.final_lengths[ts.done])

    # Value of the state the rollout stops in, for seats acting there.
    last_values = np.zeros((num_games, num_players), dtype=np.float32)
    critic_last = _critic_input_now(games, ts, config)
    for team, learner in learners.items():
        rows = ts.acting & (team_of_seat == team)[None, :]
        if rows.any():
            last_values[rows] = learner.values(critic_last[rows])
    next_active = np.concatenate([active[1:], ts.acting[None]], axis=0)

    # Sequence ends: game over, or the seat does not act next (left the game, or was not acting).
    seq_done = game_done[:, :, None] | ~next_active
    bootstrap = np.where(game_done[:, :, None] & game_truncated[:, :, None] & active, values, 0.0)
    bootstrap[-1] = np.where(~game_done[-1][:, None] & ts.acting, last_values, bootstrap[-1])
    # One GAE pass over every (slot, seat) column: [T, B, P] -> [B * P * T], each column in time
    # order and cut at its end.
    def columns(array: np.ndarray) -> np.ndarray:
        return np.moveaxis(array, 0, -1).reshape(-1)

    column_ends = np.zeros((num_games, num_players, shape[0]), dtype=bool)
    column_ends[..., -1] = True
    flat_advantages, flat_returns = compute_gae(
        columns(rewards), columns(values), columns(seq_done), columns(bootstrap), config.gamma, config.gae_lambda,
        sequence_ends=column_ends.reshape(-1))
    advantages = np.moveaxis(flat_advantages.reshape(num_games, num_players, shape[0]), -1, 0).copy()
    returns = np.moveaxis(flat_returns.reshape(num_games, num_players, shape[0]), -1, 0).copy()
    # Inactive rows hold no transition: zero them so they are inert even before masking.
    advantages[~active] = 0.0
    returns[~active] = 0.0

    seat_of_row = np.broadcast_to(np.arange(num_players), shape).astype(np.int64)

    def team_rows(array: np.ndarray, seats: np.ndarray) -> np.ndarray:
        """[T, B, P, ...] -> [T * B * len(seats), ...]: the team's seats, rows ordered (t, b, seat)."""
        return np.ascontiguousarray(array[:, :, seats].reshape(-1, *array.shape[3:]))

    batches = {
        team: MAPPOBatch(
            actor_obs=team_rows(actor_obs, seats), critic_obs=team_rows(critic_obs, seats),
            mask=team_rows(masks, seats), actions=team_rows(actions, seats), logprobs=team_rows(logprobs, seats),
            values=team_rows(values, seats), rewards=team_rows(rewards, seats),
            advantages=team_rows(advantages, seats), returns=team_rows(returns, seats),
            active=team_rows(active, seats).astype(np.float32), seats=team_rows(seat_of_row, seats))
        for team, seats in seats_of_team.items()}
    episodes = EpisodeRecord(
        team_returns={team: (np.concatenate(r) if r else np.zeros(0, np.float32)).astype(np.float32)
                      for team, r in finished_returns.items()},
        lengths=np.concatenate(finished_lengths) if finished_lengths else np.zeros(0, np.int64))
    return Rollout(batches, ts, episodes, num_steps * num_games)
