"""OpenSpiel's MCTS with random rollouts, compiled for connect four on bitboards.

In `ludus train connect_four` the MCTS anchors' searches were about half of all CPU time
(docs/scale_out.md): OpenSpiel's C++ `MCTSBot` is generic — every simulation clones a `State`,
asks for legal actions as a vector and rolls out through virtual calls, ~7.5 us a simulation
from the empty board here. This module runs the same algorithm on two 64-bit boards (John Tromp's
layout from his Fhourstones solver: 7 bits a column, the 7th always empty so that lines do not
wrap; four in a row is two shifts and ands per direction), compiled by numba, and searches a
whole batch of positions in one call.

"The same algorithm" is OpenSpiel's `MCTSBot.Step` with a `RandomRolloutEvaluator`, step by
step (open_spiel/algorithms/mcts.cc): a simulation descends while the node has been visited and
the position is not over; a node's children are created on its second visit, in a shuffled
order, and the first child with the largest UCT value (mean return for the child's mover + c
sqrt(ln N / n), unvisited children infinite, solved children their proven value) is followed;
a new leaf is valued by `rollouts` uniformly random playouts; returns are backed up for each
node's mover; with `solve`, proven wins and losses are backed up as in MCTS-Solver (Winands et
al. 2008); the search stops early once the root is proven or has a single move; the move played
is the root's best child by (proven value, visits, total return). Only the random numbers
differ (numba's Mersenne Twister seeded per search, where OpenSpiel seeds two of its own), so
the bots play the same distribution of moves, not the same moves:
tests/test_bots.py holds the two to that, move frequencies and head to head.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ROWS, COLS = 6, 7
"""OpenSpiel's connect_four board; actions are columns 0-6, seat 0 moves first."""

_HEIGHT = ROWS + 1
_CELLS = ROWS * COLS


@njit(cache=True, inline="always")
def _wins(stones: np.uint64) -> bool:
    """Four in a row anywhere in one player's stones (vertical, horizontal, both diagonals)."""
    for shift in (1, _HEIGHT, _HEIGHT - 1, _HEIGHT + 1):
        pairs = stones & (stones >> np.uint64(shift))
        if pairs & (pairs >> np.uint64(2 * shift)):
            return True
    return False


@njit(cache=True, inline="always")
def _playable(mask: np.uint64, column: int) -> bool:
    return (mask & (np.uint64(1) << np.uint64(column * _HEIGHT + ROWS - 1))) == 0


@njit(cache=True, inline="always")
def _drop(mask: np.uint64, column: int) -> np.uint64:
    """The bit of the stone that a move in `column` places (the column's lowest empty cell)."""
    return (mask + (np.uint64(1) << np.uint64(column * _HEIGHT))) & ~mask & (
        np.uint64(0x3F) << np.uint64(column * _HEIGHT))


@njit(cache=True, inline="always")
def _for(player: int, value: float) -> float:
    """A return for player 0 (as `outcome` holds them) seen by `player`."""
    return value if player == 0 else -value


@njit(cache=True, inline="always")
def _legal(mask: np.uint64, columns: np.ndarray) -> int:
    """Writes the playable columns, in order, to the front of `columns`; returns how many."""
    count = 0
    for c in range(COLS):
        if _playable(mask, c):
            columns[count] = c
            count += 1
    return count


@njit(cache=True)
def _rollout(stones0: np.uint64, stones1: np.uint64, moves: int) -> float:
    """One uniformly random playout to the end; player 0's return (+1, -1 or 0)."""
    columns = np.empty(COLS, dtype=np.int64)
    while moves < _CELLS:
        mask = stones0 | stones1
        stone = _drop(mask, columns[np.random.randint(0, _legal(mask, columns))])
        if moves % 2 == 0:
            stones0 |= stone
            if _wins(stones0):
                return 1.0
        else:
            stones1 |= stone
            if _wins(stones1):
                return -1.0
        moves += 1
    return 0.0


@njit(cache=True)
def _search(stones0: np.uint64, stones1: np.uint64, moves: int, simulations: int, uct_c: float,
            rollouts: int, solve: bool) -> int:
    """The column OpenSpiel's MCTSBot.Step would play from this (non-terminal) position."""
    to_move = moves % 2
    if simulations <= 1:
        # OpenSpiel samples from the evaluator's prior (uniform over legal moves) instead.
        columns = np.empty(COLS, dtype=np.int64)
        return columns[np.random.randint(0, _legal(stones0 | stones1, columns))]
    capacity = 1 + simulations * COLS
    action = np.full(capacity, -1, dtype=np.int64)
    mover = np.empty(capacity, dtype=np.int64)        # the player who chose this node's action
    visits = np.zeros(capacity, dtype=np.int64)
    total = np.zeros(capacity, dtype=np.float64)      # summed returns for `mover`
    solved = np.zeros(capacity, dtype=np.bool_)
    outcome = np.zeros(capacity, dtype=np.float64)    # proven return for player 0, if solved
    first_child = np.zeros(capacity, dtype=np.int64)
    num_children = np.zeros(capacity, dtype=np.int64)
    path = np.empty(_CELLS + 1, dtype=np.int64)
    order = np.empty(COLS, dtype=np.int64)
    mover[0] = to_move                                # OpenSpiel gives the root the player to move
    nodes = 1
    for _ in range(simulations):
        # Tree policy: descend while the node was visited before and the game goes on.
        node, depth = 0, 0
        path[0] = 0
        s0, s1, m = stones0, stones1, moves
        over, result = False, 0.0
        while not over and visits[node] > 0:
            if num_children[node] == 0:
                count = _legal(s0 | s1, order)
                for i in range(count - 1, 0, -1):     # Fisher-Yates, as std::shuffle
                    j = np.random.randint(0, i + 1)
                    order[i], order[j] = order[j], order[i]
                first_child[node] = nodes
                num_children[node] = count
                for i in range(count):
                    action[nodes + i] = order[i]
                    mover[nodes + i] = m % 2
                nodes += count
            best, best_value = -1, -np.inf
            log_parent = np.log(visits[node])
            for child in range(first_child[node], first_child[node] + num_children[node]):
                if solved[child]:
                    value = _for(mover[child], outcome[child])
                elif visits[child] == 0:
                    value = np.inf
                else:
                    value = total[child] / visits[child] + uct_c * np.sqrt(log_parent / visits[child])
                if value > best_value:
                    best, best_value = child, value
            stone = _drop(s0 | s1, action[best])
            if m % 2 == 0:
                s0 |= stone
                if _wins(s0):
                    over, result = True, 1.0
            else:
                s1 |= stone
                if _wins(s1):
                    over, result = True, -1.0
            m += 1
            if m == _CELLS:
                over = True
            node = best
            depth += 1
            path[depth] = node
        if over:
            solved[node] = True
            outcome[node] = result
            backing_up = solve
        else:
            result = 0.0
            for _ in range(rollouts):
                result += _rollout(s0, s1, m)
            result /= rollouts
            backing_up = False
        # Back up the return for each node's mover, and proven values while they hold.
        for d in range(depth, -1, -1):
            node = path[d]
            total[node] += _for(mover[node], result)
            visits[node] += 1
            if backing_up and num_children[node] > 0:
                chooser = mover[first_child[node]]
                best, all_solved = -1, True
                for child in range(first_child[node], first_child[node] + num_children[node]):
                    if not solved[child]:
                        all_solved = False
                    else:
                        if best < 0 or _for(chooser, outcome[child]) > _for(chooser, outcome[best]):
                            best = child
                if best >= 0 and (all_solved or _for(chooser, outcome[best]) == 1.0):
                    solved[node] = True
                    outcome[node] = outcome[best]
                else:
                    backing_up = False
        if solved[0] or num_children[0] == 1:
            break
    # The best child: proven value for its mover, then visits, then total return; first on ties.
    best = first_child[0]
    for child in range(first_child[0] + 1, first_child[0] + num_children[0]):
        a = _for(mover[best], outcome[best]) if solved[best] else 0.0
        b = _for(mover[child], outcome[child]) if solved[child] else 0.0
        if a < b or (a == b and (visits[best] < visits[child]
                                 or (visits[best] == visits[child] and total[best] < total[child]))):
            best = child
    return action[best]


@njit(cache=True)
def _search_batch(histories: np.ndarray, lengths: np.ndarray, seeds: np.ndarray, simulations: int,
                  uct_c: float, rollouts: int, solve: bool) -> np.ndarray:
    actions = np.empty(len(lengths), dtype=np.int64)
    for row in range(len(lengths)):
        np.random.seed(seeds[row])
        s0, s1 = np.uint64(0), np.uint64(0)
        over = False                                  # a full column played, or a line of four made
        for t in range(lengths[row]):
            stone = _drop(s0 | s1, histories[row, t])
            if t % 2 == 0:
                s0 |= stone
            else:
                s1 |= stone
            over = over or stone == 0 or _wins(s0 if t % 2 == 0 else s1)
        if over or lengths[row] >= _CELLS:
            actions[row] = -1                         # no position to search: the caller raises
        else:
            actions[row] = _search(s0, s1, lengths[row], simulations, uct_c, rollouts, solve)
    return actions


def search(histories, seeds: np.ndarray, simulations: int, uct_c: float, rollouts: int,
           solve: bool) -> np.ndarray:
    """The column MCTS plays in each position, given as the columns played so far from the empty
    board; one search per row, seeded by `seeds[row]` (31-bit ints). A row whose game is already
    over, or whose history is not a legal game, gets -1 (the caller, `ludus.agents.bots.builtin.MCTSBot`,
    refuses it and checks every chosen move against the game's mask)."""
    lengths = np.fromiter((len(h) for h in histories), dtype=np.int64, count=len(histories))
    padded = np.zeros((len(histories), max(1, int(lengths.max(initial=0)))), dtype=np.int64)
    for row, history in enumerate(histories):
        padded[row, :len(history)] = history
    if len(histories) and (padded.min() < 0 or padded.max() >= COLS or lengths.max() > _CELLS):
        raise ValueError(f"connect four histories hold columns 0-{COLS - 1} and at most {_CELLS} moves")
    return _search_batch(padded, lengths, np.asarray(seeds, dtype=np.int64), int(simulations), float(uct_c),
                         int(rollouts), bool(solve))
