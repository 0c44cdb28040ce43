"""Per-seat trajectories from a `VectorGame`'s TimeStep stream, and GAE over them.

A PPO transition belongs to one seat of one game slot: the seat saw `obs`, chose `action`
with behaviour log-probability `logprob`, and its critic said `value`. In a turn-based game
the consequences of that action only become known when the seat moves again, so a transition
is *opened* when the seat acts and *closed* at its next own turn (the value of that turn's
state is the bootstrap) or when the game ends (done). Rewards that arrive while other seats
move — the -1 a seat receives on the opponent's winning move — are added to the seat's open
transition. The same rule covers single-player games (closed one step later), simultaneous
games (every acting seat opens its own transition) and dialogue (a seat acting several steps
in a row closes its previous token's transition with each new token).

The slot's game auto-resets in the step it ends; the ending step's rewards are credited and
its open transitions closed before anything of the new game is recorded, so nothing leaks
across the game boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ludus.games.core import GameError, GameSpec, TimeStep


def compute_gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, bootstrap_values: np.ndarray,
                gamma: float, gae_lambda: float,
                sequence_ends: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over one seat's flat sequence of transitions.

    Schulman et al. 2016 ("High-dimensional continuous control using GAE"), eq. 16:
    A_t = sum_l (gamma*lambda)^l delta_{t+l},  delta_t = r_t + gamma*V(s_{t+1}) - V(s_t),
    computed backwards as A_t = delta_t + gamma*lambda*A_{t+1} (CleanRL's `lastgaelam` loop).

    rewards[t]:          reward the seat collected from its action t until its next turn.
    values[t]:           V(s_t), the critic's value of the state the seat acted in.
    dones[t]:            transition t is the last of its episode (terminal or truncated).
    bootstrap_values[t]: V(s_{t+1}) where the sequence does not continue into t+1: read only
                         where dones[t] (0 for a terminal state; the seat's value estimate for a
                         truncation, which is not an end by the rules) and at t = T-1 (the value
                         of the state the rollout stopped in). Elsewhere V(s_{t+1}) = values[t+1].

    sequence_ends[t]:    optional; the data of one sequence stops after t although the episode
                         goes on (several seats' sequences concatenated): bootstrap there too.

    Returns (advantages, returns) as float32, returns = advantages + values (the lambda-return
    the critic regresses on).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    dones = np.asarray(dones, dtype=bool)
    bootstrap_values = np.asarray(bootstrap_values, dtype=np.float64)
    num_steps = len(rewards)
    if not (len(values) == len(dones) == len(bootstrap_values) == num_steps):
        raise ValueError("compute_gae: rewards, values, dones and bootstrap_values must have the same length")
    stops = dones.copy()
    if num_steps:
        stops[-1] = True
    if sequence_ends is not None:
        stops |= np.asarray(sequence_ends, dtype=bool)
    next_values = np.empty(num_steps, dtype=np.float64)
    next_values[:-1] = values[1:]
    # Where the episode (or the data) stops after t, V(s_{t+1}) is the bootstrap and no
    # advantage flows back from t+1.
    next_values[stops] = bootstrap_values[stops]
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma*lambda, 0 where the sequence stops: a linear
    # recurrence, solved for every sequence at once by recursive doubling (Hillis & Steele 1986,
    # "Data parallel algorithms"): after the pass with shift s, advantages[t] sums the rows t..t+2s-1
    # of its sequence and carry[t] is the product of their c (0 once the window reaches the
    # sequence's end). log2 of the longest sequence passes over whole arrays instead of a Python
    # step per row: a league task's ~10^5 rows in sequences of ~20 take 5 passes.
    advantages = deltas.copy()
    carry = np.where(stops, 0.0, gamma * gae_lambda)
    shift = 1
    while shift < num_steps and carry[:-shift].any():
        advantages[:-shift] = advantages[:-shift] + carry[:-shift] * advantages[shift:]
        carry[:-shift] = carry[:-shift] * carry[shift:]
        shift *= 2
    return advantages.astype(np.float32), (advantages + values).astype(np.float32)


@dataclass(frozen=True)
class RolloutBatch:
    """Flat PPO training data: one row per closed transition, grouped by (slot, seat) in time order."""

    obs: np.ndarray
    """[N, *observation_shape] what the seat saw when it acted."""
    mask: np.ndarray
    """[N, A] bool legal actions then (the learner re-evaluates the masked policy on them)."""
    actions: np.ndarray
    """[N] int64 action taken."""
    logprobs: np.ndarray
    """[N] float32 behaviour log-probability of the action: the acting policy's, whatever its version."""
    values: np.ndarray
    """[N] float32 behaviour critic's value of the state (the anchor of the clipped value loss)."""
    rewards: np.ndarray
    """[N] float32 reward collected from the action until the seat's next turn or the game's end."""
    dones: np.ndarray
    """[N] bool the episode ended after this transition (terminal or truncated)."""
    advantages: np.ndarray
    """[N] float32 GAE advantages."""
    returns: np.ndarray
    """[N] float32 lambda-returns, advantages + values."""
    policy_version: np.ndarray
    """[N] int64 version of the policy that acted (the learner's lag is its version minus this)."""
    slots: np.ndarray
    """[N] int64 game slot the transition came from."""
    seats: np.ndarray
    """[N] int64 seat that acted."""
    responses: np.ndarray | None = None
    """Text agents: [N, W] int64 response tokens of each action, -1 after the response (`ActOutput.responses`)."""
    response_log_probs: np.ndarray | None = None
    """Text agents: [N, W] float32 behaviour log-probs of the response tokens, 0 after the response."""
    critic_obs: np.ndarray | None = None
    """Centralised critics: [N, D] float32 the row's critic input (`ludus.agents.rollout.side_critic_inputs`)."""

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def rows(self, keep) -> "RolloutBatch":
        """These rows (a boolean mask, indices or a slice) of every field."""
        return RolloutBatch(**{name: None if getattr(self, name) is None else getattr(self, name)[keep]
                               for name in RolloutBatch.__dataclass_fields__})


class SeatTrajectoryBuilder:
    """Keeps open and closed transitions per (game slot, seat) of a `VectorGame`.

    Per step of the vector game::

        builder.record_actions(ts, actions, log_probs, values, record, version)  # before vec.step
        ts = vec.step(actions)
        builder.record_outcome(ts)                                               # after vec.step

    and every rollout ``batch = builder.build(ts, bootstrap_values, gamma, gae_lambda)``.

    Only seats the caller marks in `record` are kept (in a league: the learner's seats; the
    opponents are frozen snapshots). Within one game a seat is either recorded at every turn
    or at none.
    """

    def __init__(self, num_games: int, num_players: int, observation_shape: tuple[int, ...], num_actions: int,
                 observation_dtype: str = "float32", capacity: int = 1024):
        self.num_games = num_games
        self.num_players = num_players
        self.observation_shape = tuple(observation_shape)
        self.num_actions = num_actions
        self.observation_dtype = np.dtype(observation_dtype)
        # Row of each (slot, seat)'s open transition in the storage below; -1 when none is open.
        self.open_row = np.full((num_games, num_players), -1, dtype=np.int64)
        self.response_width = 0
        self.critic_width = 0
        self._allocate(max(capacity, num_games * num_players))
        self.size = 0

    def _allocate(self, capacity: int) -> None:
        self.obs = np.zeros((capacity, *self.observation_shape), dtype=self.observation_dtype)
        self.mask = np.zeros((capacity, self.num_actions), dtype=bool)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.logprobs = np.zeros(capacity, dtype=np.float32)
        self.values = np.zeros(capacity, dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=bool)
        self.closed = np.zeros(capacity, dtype=bool)
        # V(s') of a closed transition: the value of the seat's next turn, 0 after a terminal
        # state, a value estimate after a truncation or a rollout cut.
        self.next_values = np.zeros(capacity, dtype=np.float32)
        self.policy_version = np.zeros(capacity, dtype=np.int64)
        self.slots = np.zeros(capacity, dtype=np.int64)
        self.seats = np.zeros(capacity, dtype=np.int64)
        if self.response_width:
            self._allocate_responses(capacity)
        if self.critic_width:
            self.critic_obs = np.zeros((capacity, self.critic_width), dtype=np.float32)

    def _allocate_responses(self, capacity: int) -> None:
        self.responses = np.full((capacity, self.response_width), -1, dtype=np.int64)
        self.response_log_probs = np.zeros((capacity, self.response_width), dtype=np.float32)

    _BASE_COLUMNS = ("obs", "mask", "actions", "logprobs", "values", "rewards", "dones", "closed", "next_values",
                     "policy_version", "slots", "seats")

    @property
    def _columns(self) -> tuple[str, ...]:
        return (self._BASE_COLUMNS + (("responses", "response_log_probs") if self.response_width else ())
                + (("critic_obs",) if self.critic_width else ()))

    def _start_responses(self, width: int) -> None:
        """Text agents' responses get their own columns, sized by the first response seen."""
        if self.size:
            raise ValueError("a builder records responses from its first row on, or never")
        self.response_width = width
        self._allocate_responses(len(self.actions))

    def _reserve(self, extra: int) -> None:
        if self.size + extra <= len(self.actions):
            return
        old = {name: getattr(self, name)[:self.size] for name in self._columns}
        self._allocate(max(2 * len(self.actions), self.size + extra))
        for name, column in old.items():
            getattr(self, name)[:self.size] = column

    @property
    def num_open(self) -> int:
        """Transitions waiting for their seat's next turn or their game's end."""
        return int((self.open_row >= 0).sum())

    def record_actions(self, ts: TimeStep, actions: np.ndarray, log_probs: np.ndarray, values: np.ndarray,
                       record: np.ndarray, policy_version: int | np.ndarray = 0,
                       responses: np.ndarray | None = None, response_log_probs: np.ndarray | None = None,
                       critic_obs: np.ndarray | None = None) -> None:
        """Open a transition for every recorded acting seat, closing that seat's previous one.

        ts: the TimeStep the actions answer. actions, log_probs, values: [B, P] (entries of
        unrecorded seats are ignored). record: [B, P] bool (or anything broadcastable to it,
        e.g. [P] for the same seats in every slot); only seats that act in `ts` are recorded.
        policy_version: the acting policy's version, an int or [B, P].
        responses, response_log_probs: text agents' [B, P, W] response tokens and their log-probs.
        critic_obs: centralised critics' [B, P, D] input of every seat (recorded from the first row
        on, or never, like responses).
        """
        num_players = self.num_players
        record = np.broadcast_to(np.asarray(record, dtype=bool), (self.num_games, num_players)) & ts.acting
        acting_unrecorded = ts.acting > record
        if acting_unrecorded.any() and (self.open_row[acting_unrecorded] >= 0).any():
            b, p = np.argwhere(acting_unrecorded & (self.open_row >= 0))[0]
            raise ValueError(f"slot {b} seat {p} acts unrecorded while its last transition is still open: "
                             f"keep a seat's `record` flag fixed for the whole game")
        # Flat (slot * num_players + seat) indices in row-major order: one gather per column
        # (`take_rows` on [B * P, ...] views, straight into the storage) instead of two-array
        # fancy indexing, ~2x cheaper per step.
        where = np.flatnonzero(record)
        count = len(where)
        if count == 0:
            return
        acting_values = np.asarray(values, dtype=np.float32).reshape(-1)[where]
        open_row = self.open_row.reshape(-1)
        # The previous transition of each acting seat ends here: its next state is this one.
        previous = open_row[where]
        has_previous = previous >= 0
        closing = previous[has_previous]
        self.next_values[closing] = acting_values[has_previous]
        self.closed[closing] = True

        self._reserve(count)
        start, end = self.size, self.size + count
        rows = slice(start, end)
        take_rows(ts.obs.reshape(len(open_row), *self.observation_shape), where, out=self.obs[rows])
        take_rows(ts.mask.reshape(len(open_row), -1), where, out=self.mask[rows])
        self.actions[rows] = np.asarray(actions).reshape(-1)[where]
        self.logprobs[rows] = np.asarray(log_probs).reshape(-1)[where]
        self.values[rows] = acting_values
        self.rewards[rows] = 0.0
        self.dones[rows] = False
        self.closed[rows] = False
        self.next_values[rows] = 0.0
        if np.ndim(policy_version) == 0:
            self.policy_version[rows] = policy_version
        else:
            self.policy_version[rows] = np.asarray(policy_version, dtype=np.int64).reshape(-1)[where]
        slots, seats = np.divmod(where, num_players, out=(self.slots[rows], self.seats[rows]))
        if responses is not None:
            if not self.response_width:
                self._start_responses(responses.shape[2])
            if responses.shape[2] != self.response_width:
                raise ValueError(f"responses are {responses.shape[2]} tokens wide, this builder's {self.response_width}")
            self.responses[rows] = responses[slots, seats]
            self.response_log_probs[rows] = response_log_probs[slots, seats]
        elif self.response_width:
            raise ValueError("this builder records responses: every recorded row needs one")
        if critic_obs is not None:
            critic_obs = np.asarray(critic_obs, dtype=np.float32)
            if not self.critic_width:
                if self.size:
                    raise ValueError("a builder records critic inputs from its first row on, or never")
                self.critic_width = critic_obs.shape[2]
                self.critic_obs = np.zeros((len(self.actions), self.critic_width), dtype=np.float32)
            if critic_obs.shape[2] != self.critic_width:
                raise ValueError(f"critic inputs are {critic_obs.shape[2]} wide, this builder's {self.critic_width}")
            self.critic_obs[rows] = critic_obs[slots, seats]
        elif self.critic_width:
            raise ValueError("this builder records critic inputs: every recorded row needs one")
        open_row[where] = np.arange(start, end)
        self.size = end

    def record_outcome(self, ts: TimeStep) -> None:
        """Credit this step's rewards to the open transitions and close those of ended games.

        ts: the TimeStep returned by `VectorGame.step`. Rewards of seats with no open transition
        (unrecorded seats, or a seat rewarded before its first action) are not kept.
        """
        # Only seats rewarded this step and slots whose game ended touch an open transition (a few
        # percent of the slots in a board game): index those, not the whole [B, P] table.
        step_rewards = ts.rewards.reshape(-1)
        rewarded = np.flatnonzero(step_rewards)
        rows = self.open_row.reshape(-1)[rewarded]
        is_open = rows >= 0
        self.rewards[rows[is_open]] += step_rewards[rewarded[is_open]]
        ended_slots = np.flatnonzero(ts.done)
        if not len(ended_slots):
            return
        rows = self.open_row[ended_slots]
        ended = rows >= 0
        rows = rows[ended]
        self.dones[rows] = True
        self.closed[rows] = True
        # A terminal state is worth nothing more. A truncation is not an end by the game's rules:
        # bootstrap from the seat's own value estimate, the last state its critic saw (with
        # auto-reset the TimeStep already holds the next game's observation).
        truncated = np.broadcast_to(ts.truncated[ended_slots, None], ended.shape)[ended]
        self.next_values[rows] = np.where(truncated, self.values[rows], 0.0)
        self.open_row[ended_slots] = -1

    def end_game(self, slot: int, rewards: np.ndarray) -> None:
        """The game in `slot` ends now, outside the game's rules (a seat forfeited): credit
        `rewards` [P] to the slot's open transitions and close them as terminal. The slot's
        seats record nothing more until its next game."""
        seats = np.flatnonzero(self.open_row[slot] >= 0)
        rows = self.open_row[slot, seats]
        self.rewards[rows] += np.asarray(rewards, dtype=np.float32)[seats]
        self.dones[rows] = True
        self.closed[rows] = True
        self.next_values[rows] = 0.0
        self.open_row[slot, seats] = -1

    def build(self, ts: TimeStep, bootstrap_values: np.ndarray | None, gamma: float,
              gae_lambda: float) -> RolloutBatch:
        """All closed transitions as a `RolloutBatch` with GAE per (slot, seat) sequence.

        ts: the current TimeStep (the one the next actions will answer).
        bootstrap_values: [B, P] the critic's value of `ts.obs` for acting seats. An open
        transition of a seat acting now is closed with it (not done: the rollout stops there,
        as CleanRL's `next_value`). None keeps every open transition open for a later batch.
        Transitions still open after this (seats waiting for other seats' moves) stay in the
        builder and appear in a later batch, with their behaviour log-probs.
        """
        if bootstrap_values is not None:
            cut = (self.open_row >= 0) & ts.acting
            rows = self.open_row[cut]
            self.next_values[rows] = np.asarray(bootstrap_values, dtype=np.float32)[cut]
            self.closed[rows] = True
            self.open_row[cut] = -1

        closed_rows = np.flatnonzero(self.closed[:self.size])
        # Group by (slot, seat), in time order within each: rows grow with time, so a stable sort
        # on the (slot, seat) key keeps it.
        key = self.slots[closed_rows] * self.num_players + self.seats[closed_rows]
        order = closed_rows[stable_order(key, self.num_games * self.num_players)]
        batch_columns = {name: take_rows(getattr(self, name), order) for name in self._columns}

        # One backward pass over all (slot, seat) sequences at once: a closed, not-done transition
        # is followed in its sequence by the turn that closed it, or, at the end of the sequence,
        # bootstraps from next_values.
        sequence_key = batch_columns["slots"] * self.num_players + batch_columns["seats"]
        sequence_ends = np.ones(len(order), dtype=bool)
        sequence_ends[:-1] = sequence_key[1:] != sequence_key[:-1]
        advantages, returns = compute_gae(
            batch_columns["rewards"], batch_columns["values"], batch_columns["dones"],
            batch_columns["next_values"], gamma, gae_lambda, sequence_ends=sequence_ends)

        self._keep_open_only()
        return RolloutBatch(
            obs=batch_columns["obs"], mask=batch_columns["mask"], actions=batch_columns["actions"],
            logprobs=batch_columns["logprobs"], values=batch_columns["values"], rewards=batch_columns["rewards"],
            dones=batch_columns["dones"], advantages=advantages, returns=returns,
            policy_version=batch_columns["policy_version"], slots=batch_columns["slots"],
            seats=batch_columns["seats"], responses=batch_columns.get("responses"),
            response_log_probs=batch_columns.get("response_log_probs"), critic_obs=batch_columns.get("critic_obs"))

    def _keep_open_only(self) -> None:
        """Move the open transitions to the front of the storage (in their time order)."""
        open_mask = self.open_row >= 0
        old_rows = np.sort(self.open_row[open_mask])
        count = len(old_rows)
        for name in self._columns:
            column = getattr(self, name)
            column[:count] = column[old_rows]
        new_row_of_old = np.full(self.size, -1, dtype=np.int64)
        new_row_of_old[old_rows] = np.arange(count)
        self.open_row[open_mask] = new_row_of_old[self.open_row[open_mask]]
        self.size = count


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` for integer keys in [0, bound): below 2**16 the keys are
    sorted as uint16, on which numpy's stable sort is a radix sort (several times faster than
    the merge sort it runs on int64)."""
    if bound <= np.iinfo(np.uint16).max + 1:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def take_rows(array: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`array[rows]` for in-range row indices, as one np.take over a [N, -1] view: 2-3x faster here
    than fancy indexing of [N, C, H, W] boards. `out` (contiguous, [len(rows), ...]) receives the
    rows in place. The indices are in range by construction: mode="clip" skips the bounds check,
    and with it the buffered copy that mode="raise" makes of `out`."""
    flat = array.reshape(len(array), -1)
    if out is not None:
        if not out.flags.c_contiguous:
            raise ValueError("take_rows writes into a contiguous `out` only (a reshaped copy would lose the rows)")
        np.take(flat, rows, axis=0, out=out.reshape(len(rows), -1), mode="clip")
        return out
    return np.take(flat, rows, axis=0, mode="clip").reshape(len(rows), *array.shape[1:])


# ---------------------------------------------------------------------------------------------
# Centralised critics' inputs (MAPPO in a league: the runners record them, agents/rl/mappo.py reads them)


def side_critic_inputs(obs: np.ndarray, global_state: np.ndarray | None, team_of_seat: tuple[int, ...]) -> np.ndarray:
    """[S, P, D] float32: what the centralised critic reads for every seat of S games (no seat
    ids: the learner appends them). The game's global state [S, Ds] where it has one, else the
    concatenation of the observations of the seat's side (its team's seats, in seat order)."""
    obs = np.asarray(obs, dtype=np.float32)
    slots, num_players = obs.shape[0], obs.shape[1]
    if global_state is not None:
        state = np.asarray(global_state, dtype=np.float32).reshape(slots, -1)
        return np.ascontiguousarray(np.broadcast_to(state[:, None, :], (slots, num_players, state.shape[1])))
    flat = obs.reshape(slots, num_players, -1)
    teams = np.asarray(team_of_seat)
    sides = {team: flat[:, teams == team].reshape(slots, -1) for team in np.unique(teams)}
    widths = {side.shape[1] for side in sides.values()}
    if len(widths) != 1:
        raise GameError("sides of different sizes and no global state: the centralised critic's input would "
                        "change width with the side; give the game a global state (spec.state_shape)")
    return np.stack([sides[team] for team in teams], axis=1)


def side_critic_size(spec: GameSpec) -> int:
    """Width of `side_critic_inputs` for a game (GameError for sides of unequal size without a global state)."""
    if spec.state_shape is not None:
        return int(np.prod(spec.state_shape))
    obs = np.zeros((1, spec.num_players, *spec.observation_shape), dtype=np.float32)
    return int(side_critic_inputs(obs, None, spec.team_of_seat).shape[2])
