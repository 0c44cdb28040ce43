"""Native connect four and tic-tac-toe: one game per object, or thousands per numpy call.

Both are m,n,k-games (OpenSpiel's ``mnk``): two players alternately put a stone on a
``rows x cols`` board and the first to get ``k`` in a row (horizontally, vertically or
diagonally) wins. Tic-tac-toe is the 3,3,3-game with action = cell (row-major, as pyspiel's
``tic_tac_toe``); connect four is the 6,7,4-game with *gravity*: action = column and the stone
drops to the lowest empty cell (as pyspiel's ``connect_four``). Player 0 ('x') moves first; the
winner gets +1 and the loser -1 on the final step, a full board without a line is a draw (0, 0).

Observations are uint8 planes of 0s and 1s from the observing seat's point of view, shape
``[3, rows, cols]`` = (own stones, opponent stones, empty cells): exact, and a quarter of
float32's bytes in the arrays a self-play runner gathers every step (the nets read them in their
own dtype). Row 0 is the bottom row for
gravity games (the row order of pyspiel's ``connect_four`` observation tensor) and the top row
otherwise (pyspiel's ``tic_tac_toe``).

`MNKGame` is the plain single-game implementation (a grid and a line scan through the last
stone). `MNKVectorGame` steps B games per call with bitboards, one ``uint64`` per game for the
stones of the player to move and one for all stones, so a step is a few dozen whole-array
numpy operations and no Python loop over games. Bit ``r * cols + c`` is cell (row r, column c)
in observation order; a line of k stones is found with the shift-and trick of Pons' connect
four solver ("Solving Connect 4", 2019): ``p & (p >> s)`` marks the starts of pairs along the
direction whose bit offset is s, doubling to runs of k, and a mask of the cells where a k-line
fits on the board removes runs that wrap across an edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ludus.games.core import GameError, GameSpec, SeedSource, TimeStep, no_global_state
from ludus.games.registry import GameEntry

_U64 = np.uint64
_M32 = 0xFFFFFFFF
# (dr, dc) of the four line directions: along a row, up a column, and the two diagonals.
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


@dataclass(frozen=True)
class MNKRules:
    """The rules of one m,n,k-game; everything else is derived from them."""

    name: str
    """Registry id of the game (``connect_four``)."""
    rows: int
    """Board height."""
    cols: int
    """Board width."""
    k: int
    """Stones in a row needed to win."""
    gravity: bool
    """True: action = column, the stone falls to the lowest empty cell (row 0 is the bottom).
    False: action = cell index ``row * cols + col`` (row 0 is the top)."""
    spiel_name: str | None
    """The equivalent pyspiel game string (same action ids and returns)."""

    def __post_init__(self) -> None:
        if self.rows * self.cols > 64:
            raise GameError(f"game {self.name!r}: a bitboard holds at most 64 cells, "
                            f"got {self.rows}x{self.cols}")

    @property
    def num_cells(self) -> int:
        return self.rows * self.cols

    @property
    def num_actions(self) -> int:
        return self.cols if self.gravity else self.num_cells

    def spec(self) -> GameSpec:
        return GameSpec(
            id=self.name,
            num_players=2,
            num_actions=self.num_actions,
            observation_shape=(3, self.rows, self.cols),
            zero_sum=True,
            utility_sum=0.0,
            min_utility=-1.0,
            max_utility=1.0,
            max_length=self.num_cells,
            spiel_name=self.spiel_name,
            observation_low=0.0,
            observation_high=1.0,
            binary_observations=True,
            observation_dtype="uint8",
        )


CONNECT_FOUR = MNKRules("connect_four", rows=6, cols=7, k=4, gravity=True, spiel_name="connect_four")
TIC_TAC_TOE = MNKRules("tic_tac_toe", rows=3, cols=3, k=3, gravity=False, spiel_name="tic_tac_toe")

_STONE_CHARS = ".xo"  # empty, seat 0, seat 1: pyspiel's characters


def board_text(grid: np.ndarray, rules: MNKRules) -> str:
    """The board as pyspiel prints it (top row first, 'x' for seat 0, 'o' for seat 1, '.' empty).

    `grid[r, c]` is 0 (empty), 1 (seat 0) or 2 (seat 1) in observation row order."""
    rows = grid[::-1] if rules.gravity else grid
    return "\n".join("".join(_STONE_CHARS[v] for v in row) for row in rows)


class MNKGame:
    """One m,n,k-game (the `Game` protocol). Connect four: ``MNKGame(CONNECT_FOUR)``."""

    def __init__(self, rules: MNKRules):
        self.rules = rules
        self.spec = rules.spec()
        self.reset(0)

    def reset(self, seed: int) -> None:
        """Start a new game; the seed is accepted for the protocol (the game has no chance)."""
        self._grid = np.zeros((self.rules.rows, self.rules.cols), dtype=np.int8)
        self._history: list[int] = []
        self._returns = np.zeros(2, dtype=np.float32)
        self._won = False

    def is_terminal(self) -> bool:
        return self._won or len(self._history) == self.rules.num_cells

    def is_truncated(self) -> bool:
        return False

    def to_move(self) -> tuple[int, ...]:
        return () if self.is_terminal() else (len(self._history) % 2,)

    def observation(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        own, opponent = seat + 1, 2 - seat
        return np.stack([self._grid == own, self._grid == opponent, self._grid == 0]).astype(np.uint8)

    def legal_mask(self, seat: int) -> np.ndarray:
        self._check_seat(seat)
        if seat not in self.to_move():
            return np.zeros(self.spec.num_actions, dtype=bool)
        if self.rules.gravity:
            return self._grid[-1] == 0  # a column is open while its top cell is empty
        return self._grid.reshape(-1) == 0

    def step(self, actions: dict[int, int]) -> np.ndarray:
        movers = self.to_move()
        if not movers:
            raise GameError("the game is over: reset it before stepping")
        seat = movers[0]
        if set(actions) != {seat}:
            raise GameError(f"seat {seat} is to move; got actions for seats {sorted(actions)}")
        action = int(actions[seat])
        if not (0 <= action < self.spec.num_actions) or not self.legal_mask(seat)[action]:
            raise GameError(f"illegal action {action} for seat {seat} in {self.spec.id}: "
                            f"legal are {np.flatnonzero(self.legal_mask(seat)).tolist()}")
        if self.rules.gravity:
            row, col = int(np.argmax(self._grid[:, action] == 0)), action
        else:
            row, col = divmod(action, self.rules.cols)
        self._grid[row, col] = seat + 1
        self._history.append(action)
        rewards = np.zeros(2, dtype=np.float32)
        if self._makes_line(row, col):
            self._won = True
            rewards[seat], rewards[1 - seat] = 1.0, -1.0
            self._returns += rewards
        return rewards

    def _makes_line(self, row: int, col: int) -> bool:
        """Whether the stone just put at (row, col) completes k in a row through it."""
        stone = self._grid[row, col]
        rows, cols = self._grid.shape
        for dr, dc in _DIRECTIONS:
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, col + sign * dc
                while 0 <= r < rows and 0 <= c < cols and self._grid[r, c] == stone:
                    count += 1
                    r, c = r + sign * dr, c + sign * dc
            if count >= self.rules.k:
                return True
        return False

    def returns(self) -> np.ndarray:
        return self._returns.copy()

    def history(self) -> tuple[int, ...]:
        return tuple(self._history)

    def render(self) -> str:
        return board_text(self._grid, self.rules)

    def _check_seat(self, seat: int) -> None:
        if seat not in (0, 1):
            raise GameError(f"{self.spec.id} has seats 0 and 1, got {seat}")


def fast_counter_seed_source(seed: int) -> SeedSource:
    """The seeds of `ludus.games.core.counter_seed_source(seed)`, in the same order, computed in bulk.

    `counter_seed_source` spawns one `np.random.SeedSequence` child per seed (~7 us each), which
    would cost more than a whole batched step when hundreds of games end per step. Child i of
    ``SeedSequence(seed)`` hashes the root entropy, padded to the pool of 4 words, followed by the
    word i (numpy's ``SeedSequence.mix_entropy``, after O'Neill's ``seed_seq_fe``). Everything
    before the word i is the same for every child, so it is hashed once here in Python integers;
    the last mixing round and ``generate_state(1, uint64)`` run over all requested i at once.
    Tests check the output against `counter_seed_source`.
    """
    init_a, mult_a, init_b, mult_b = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
    mix_l, mix_r = 0xCA01F9DD, 0x4973F715
    root = np.random.SeedSequence(seed)
    entropy = int(root.entropy)
    words = []
    while True:
        words.append(entropy & _M32)
        entropy >>= 32
        if entropy == 0:
            break
    words += [0] * (4 - len(words))  # numpy pads the run entropy to the pool size when spawning
    hash_const = init_a

    def hashmix(value: int) -> int:
        nonlocal hash_const
        value ^= hash_const
        hash_const = (hash_const * mult_a) & _M32
        value = (value * hash_const) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        result = (mix_l * x - mix_r * y) & _M32
        return result ^ (result >> 16)

    pool = [hashmix(w) for w in words[:4]]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in words[4:]:
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(word))
    # The child's index word is mixed into pool words 0..3 in turn; only words 0 and 1 reach a
    # 64-bit seed. Record the (xor, multiply) constants hashmix uses for them.
    index_consts = []
    for _ in range(4):
        xor = hash_const
        hash_const = (hash_const * mult_a) & _M32
        index_consts.append((xor, hash_const))
    u32 = np.uint32
    pool01 = np.array(pool[:2], dtype=u32)
    index_xor = np.array([c[0] for c in index_consts[:2]], dtype=u32)
    index_mult = np.array([c[1] for c in index_consts[:2]], dtype=u32)
    out_xor = np.array([init_b, (init_b * mult_b) & _M32], dtype=u32)
    out_mult = np.array([(init_b * mult_b) & _M32, (init_b * mult_b * mult_b) & _M32], dtype=u32)
    spawned = 0

    def next_seeds(n: int) -> np.ndarray:
        nonlocal spawned
        first, spawned = spawned, spawned + n
        if first + n - 1 > _M32:  # child index of two words: take numpy's own path
            return np.array([np.random.SeedSequence(root.entropy, spawn_key=(i,)).generate_state(1, np.uint64)[0]
                             for i in range(first, first + n)], dtype=np.uint64)
        index = np.arange(first, first + n, dtype=u32)[:, None]
        hashed = (index ^ index_xor) * index_mult
        hashed ^= hashed >> u32(16)
        mixed = u32(mix_l) * pool01 - u32(mix_r) * hashed
        mixed ^= mixed >> u32(16)
        state = (mixed ^ out_xor) * out_mult
        state ^= state >> u32(16)
        return state[:, 0].astype(np.uint64) | (state[:, 1].astype(np.uint64) << _U64(32))

    return next_seeds


class MNKVectorGame:
    """B m,n,k-games stepped per call on bitboards (the `VectorGame` protocol).

    The arrays of each returned `TimeStep` are fresh: the engine never writes to them later.
    Games that end are reset at once; the games have no chance, but one seed per new game is
    still drawn from `seed_source` so a league's seed source sees every game start.
    """

    def __init__(self, rules: MNKRules, num_games: int, seed: int = 0):
        if num_games < 1:
            raise GameError(f"num_games must be >= 1, got {num_games}")
        self.rules = rules
        self.spec = rules.spec()
        self.num_games = num_games
        self.seed_source: SeedSource = fast_counter_seed_source(seed)
        rows, cols, cells = rules.rows, rules.cols, rules.num_cells
        self._full = _U64((1 << cells) - 1)
        # One bit per cell of each column, and the single-cell bits (the placement tables).
        self._column_bits = np.array([sum(1 << (r * cols + c) for r in range(rows)) for c in range(cols)], _U64)
        self._cell_bits = np.array([1 << i for i in range(cells)], _U64)
        self._top_row_shift = _U64((rows - 1) * cols)
        self._column_set = _U64((1 << cols) - 1)
        # For each direction ([D, 1] columns, so that one array op covers all directions): the bit
        # offset of one step, and the cells where a k-line starting there fits on the board.
        steps, starts = [], []
        for dr, dc in _DIRECTIONS:
            fits = 0
            for r in range(rows):
                for c in range(cols):
                    end_r, end_c = r + dr * (rules.k - 1), c + dc * (rules.k - 1)
                    if 0 <= end_r < rows and 0 <= end_c < cols:
                        fits |= 1 << (r * cols + c)
            if fits:
                steps.append(dr * cols + dc)
                starts.append(fits)
        self._line_steps = np.array(steps, _U64)[:, None]
        self._line_starts = np.array(starts, _U64)[:, None]
        # Legal actions are empty cells of the empty plane: the top row for gravity games (a column
        # is open while its top cell is empty), else every cell; their bits in a seat's unpacked
        # observation start here.
        self._legal_bit_offset = 2 * cells + ((rows - 1) * cols if rules.gravity else 0)
        self._own = np.zeros(num_games, _U64)  # stones of the player to move
        self._occupied = np.zeros(num_games, _U64)
        self._length = np.zeros(num_games, np.int64)
        self._moves = np.zeros((num_games, cells), np.int8)  # per-slot move log
        self._move_index_base = np.arange(num_games, dtype=np.int64) * cells

    # -- the rules on bitboards ---------------------------------------------------------------

    def _placement(self, actions: np.ndarray) -> np.ndarray:
        """Bit of the cell each action puts a stone on; 0 where the action is illegal."""
        if self.rules.gravity:
            empty_in_column = self._column_bits.take(actions)
            empty_in_column &= ~self._occupied
            # lowest set bit (x & -x): the lowest empty cell, rows being numbered from the bottom
            return empty_in_column & (~empty_in_column + _U64(1))
        cell = self._cell_bits.take(actions)
        cell &= ~self._occupied
        return cell

    def _has_line(self, stones: np.ndarray) -> np.ndarray:
        """[B] bool: the stones hold k in a row."""
        runs = _run_starts(stones[None, :], self._line_steps, self.rules.k)  # [D, B]
        runs &= self._line_starts
        return runs.any(axis=0)

    def _legal_bits(self) -> np.ndarray:
        """[B] uint64 with bit a set when action a is legal for the player to move."""
        if self.rules.gravity:
            return (~self._occupied >> self._top_row_shift) & self._column_set
        return ~self._occupied & self._full

    # -- the VectorGame protocol ------------------------------------------------------------

    def reset(self, seeds: Sequence[int] | np.ndarray) -> TimeStep:
        seeds = np.asarray(seeds)
        if seeds.shape != (self.num_games,):
            raise GameError(f"reset needs {self.num_games} seeds, got shape {seeds.shape}")
        self._own[:] = 0
        self._occupied[:] = 0
        self._length[:] = 0
        b, p = self.num_games, 2
        return self._timestep(np.zeros((b, p), np.float32), np.zeros(b, bool),
                              np.zeros((b, p), np.float32), np.zeros(b, np.int64))

    def step(self, actions: np.ndarray) -> TimeStep:
        actions = np.asarray(actions)
        if actions.shape != (self.num_games, 2) or not np.issubdtype(actions.dtype, np.integer):
            raise GameError(f"step needs integer actions of shape ({self.num_games}, 2), "
                            f"got {actions.dtype} {actions.shape}")
        mover_is_1 = (self._length & 1).astype(bool)
        action = np.where(mover_is_1, actions[:, 1], actions[:, 0])
        if action.min() < 0 or action.max() >= self.spec.num_actions:
            slot = int(np.flatnonzero((action < 0) | (action >= self.spec.num_actions))[0])
            raise GameError(f"action {action[slot]} out of range 0..{self.spec.num_actions - 1} in slot {slot}")
        move = self._placement(action)
        if not move.all():
            slot = int(np.argmin(move != 0))
            bits = int(self._legal_bits()[slot])
            legal = [a for a in range(self.spec.num_actions) if (bits >> a) & 1]
            raise GameError(f"illegal action {action[slot]} in slot {slot} of {self.spec.id}: legal are {legal}")
        mover_stones = self._own | move
        self._occupied |= move
        won = self._has_line(mover_stones)
        self._moves.reshape(-1)[self._move_index_base + self._length] = action
        self._length += 1
        done = won | (self._length == self.rules.num_cells)
        # Only the final step pays: +1 to the mover and -1 to the other seat if the move won.
        rewards = np.empty((self.num_games, 2), np.float32)
        np.subtract(1.0, mover_is_1, out=rewards[:, 0])  # +1 if seat 0 moved, -1 if seat 1
        rewards[:, 0] -= mover_is_1
        rewards[:, 0] *= won
        np.negative(rewards[:, 0], out=rewards[:, 1])
        final_returns = rewards.copy()
        final_lengths = np.where(done, self._length, 0)
        np.bitwise_xor(self._occupied, mover_stones, out=self._own)  # the other player moves next
        if done.any():
            ended = np.flatnonzero(done)
            self.seed_source(len(ended))
            self._own[ended] = 0
            self._occupied[ended] = 0
            self._length[ended] = 0
        return self._timestep(rewards, done, final_returns, final_lengths)

    def _timestep(self, rewards: np.ndarray, done: np.ndarray, final_returns: np.ndarray,
                  final_lengths: np.ndarray) -> TimeStep:
        b, rows, cols = self.num_games, self.rules.rows, self.rules.cols
        acting = np.empty((b, 2), bool)
        acting[:, 1] = (self._length & 1).astype(bool)
        np.logical_not(acting[:, 1], out=acting[:, 0])
        # Observation bits of both seats: the acting seat's packed planes, zeros for the other.
        seat_bits = np.negative(acting.astype(_U64))  # all ones in the acting seat's column
        words = self._packed_planes()
        # little-endian words, so that byte i holds bits 8i..8i+7 for the unpack below
        seat_words = np.empty((b, 2, len(words)), "<u8")
        for seat in (0, 1):
            for index, word in enumerate(words):
                np.bitwise_and(word, seat_bits[:, seat], out=seat_words[:, seat, index])
        # Unpacking just the planes' bits along the last axis gives the observations contiguous
        # (unpacking all the words, then copying the planes out, took ~5x as long). The legal
        # moves' bits are among them: the empty plane's cells (its top row under gravity).
        obs = np.unpackbits(seat_words.view(np.uint8).reshape(b, 2, -1), axis=2, count=3 * rows * cols,
                            bitorder="little")
        legal_bits = obs[:, :, self._legal_bit_offset:self._legal_bit_offset + self.spec.num_actions]
        return TimeStep(
            obs=obs.reshape(b, 2, 3, rows, cols),
            mask=legal_bits.view(bool).copy(),
            acting=acting,
            rewards=rewards,
            done=done,
            truncated=np.zeros(b, bool),
            final_returns=final_returns,
            final_lengths=final_lengths,
        )

    def _packed_planes(self) -> list[np.ndarray]:
        """The planes (own, opponent, empty) of the player to move, packed into 64-bit words,
        plane p at bit p * num_cells: one unpack then gives the three planes in a row."""
        cells = self.rules.num_cells
        planes = (self._own, self._occupied ^ self._own, ~self._occupied & self._full)
        words: list[np.ndarray | None] = [None] * ((3 * cells + 63) // 64)

        def put(index: int, part: np.ndarray) -> None:
            words[index] = part if words[index] is None else words[index] | part

        for index, plane in enumerate(planes):
            word, shift = divmod(index * cells, 64)
            put(word, plane << _U64(shift) if shift else plane)
            if shift + cells > 64:  # the plane straddles two words
                put(word + 1, plane >> _U64(64 - shift))
        return words

    def history(self, b: int) -> tuple[int, ...]:
        return tuple(int(a) for a in self._moves[b, : self._length[b]])

    def history_array(self) -> tuple[np.ndarray, np.ndarray]:
        """([B, max_length] int8 move log, [B] int64 counts) of the running games (copies)."""
        return self._moves.copy(), self._length.copy()

    def global_states(self) -> np.ndarray:
        raise no_global_state(self.spec)

    def render(self, b: int) -> str:
        return board_text(self._grid(b), self.rules)

    def _grid(self, b: int) -> np.ndarray:
        """[rows, cols] of 0 (empty), 1 (seat 0), 2 (seat 1) for slot b."""
        own, occupied = int(self._own[b]), int(self._occupied[b])
        seat_to_move = int(self._length[b]) & 1
        cells = np.array([(occupied >> i) & 1 for i in range(self.rules.num_cells)], np.int8)
        mine = np.array([(own >> i) & 1 for i in range(self.rules.num_cells)], np.int8)
        # a stone is the mover's (seat_to_move + 1) or the other seat's (2 - seat_to_move)
        grid = cells * np.where(mine == 1, seat_to_move + 1, 2 - seat_to_move)
        return grid.astype(np.int8).reshape(self.rules.rows, self.rules.cols)


def _run_starts(stones: np.ndarray, step: np.ndarray, k: int) -> np.ndarray:
    """Bit i set iff bits i, i+step, ..., i+(k-1)*step of `stones` are all set (broadcasting
    `stones` against the uint64 bit offsets `step`).

    Runs double in length (``run & (run >> length*step)``) and the binary digits of k pick
    which runs to join, so k=4 costs two shift-ands and k=3 three."""
    result = None
    offset = 0
    run, length = stones, 1
    while True:
        if k & length:
            part = run >> (step * _U64(offset)) if offset else run
            result = part if result is None else result & part
            offset += length
        if 2 * length > k:
            return result
        run = run & (run >> (step * _U64(length)))
        length *= 2


def make_connect_four() -> MNKGame:
    return MNKGame(CONNECT_FOUR)


def make_connect_four_vector(num_games: int, seed: int = 0) -> MNKVectorGame:
    return MNKVectorGame(CONNECT_FOUR, num_games, seed)


def make_tic_tac_toe() -> MNKGame:
    return MNKGame(TIC_TAC_TOE)


def make_tic_tac_toe_vector(num_games: int, seed: int = 0) -> MNKVectorGame:
    return MNKVectorGame(TIC_TAC_TOE, num_games, seed)


_MNK_PLANES = ("uint8 [3, rows, cols] from the observing seat's side: plane 0 its own stones, plane 1 the "
               "opponent's, plane 2 the empty cells (1 where true, else 0).")
CONNECT_FOUR_ENTRY = GameEntry(
    "connect_four", make_connect_four, make_connect_four_vector,
    "Connect four, 6x7, action = column; natively batched on bitboards (same actions and returns as pyspiel)",
    layout=f"observation: {_MNK_PLANES} Shape [3, 6, 7]; row 0 is the BOTTOM row, column 0 the leftmost.\n"
           "actions: 0..6 = the column to drop a stone into (0 leftmost); a full column is illegal.\n"
           "seat 0 moves first; +1 to the winner and -1 to the loser at the end, 0 each for a draw.")
TIC_TAC_TOE_ENTRY = GameEntry(
    "tic_tac_toe", make_tic_tac_toe, make_tic_tac_toe_vector,
    "Tic-tac-toe, action = cell 0..8 row-major; natively batched on bitboards (same as pyspiel)",
    layout=f"observation: {_MNK_PLANES} Shape [3, 3, 3]; row 0 is the TOP row.\n"
           "actions: 0..8 = the cell row * 3 + column (0 top left, 8 bottom right); occupied cells are illegal.\n"
           "seat 0 moves first; +1 to the winner and -1 to the loser at the end, 0 each for a draw.")
