"""How far a learner that does not generalise across positions gets at tic-tac-toe from N games of play.

`goal llm_tictactoe_from_play` (issue 77) asks the LM learner from play (`text_smmd`, preset
`llm_any_game`) for 0.80 against the random mover after 30 minutes. A run there plays ~640 games
(20 updates of 32 matches) and reaches 0.56, near the base. This script asks what the same
numbers of games give a learner that keeps a separate entry for every position (tabular), two of
them, both more generous than the LM's:

* `mmd`: `text_smmd`'s answer-level step as the recipe runs it (`TextSMMDConfig`: alpha 0.5,
  eta 1, uniform magnet; 32 matches an update; 80% self-play, the rest against a random mover,
  standing in for the anchors), with an exact step to the MMD target (the LM distils towards it in
  4 Adam steps) and a critic that is the mean Monte-Carlo return of every (position, answer) seen
  so far (the LM's is refitted on each update's turns);
* `fqi`: fitted Q iteration over every transition seen so far (the learner's own next position,
  Q(s, a) = mean of r + max_a' Q(s', a')), acting by softmax(Q / 0.1): a learner that reuses every game
  at every update, far more sample-efficient than a policy-gradient step; the ceiling.

Positions never seen keep the uniform policy (where the base SmolLM2 is: 0.51-0.65 against the
random mover). The score against the random mover is exact (every line of play), averaged over
the two seats (win 1, draw 0.5, loss 0), as the benchmark's Wilson interval estimates it.

    python scripts/ttt_from_play_ceiling.py [--games 640 1920] [--seeds 3]

(`--games 6400` gives the third row of docs/llm.md's table, in ~5 minutes.)

If a tabular learner needs several thousand games for 0.80, then 0.80 in a 30-minute run (at most
~2,000 games on a 2-core CPU with no time for learning) needs the LM to carry what it learns at
one position to others; docs/llm.md reports the figures.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Sequence

import numpy as np
import pyspiel

GAME = pyspiel.load_game("tic_tac_toe")
Key = str  # the board as OpenSpiel prints it: what the LM's prompt shows (whose turn follows from it)


class TablePolicy:
    """Logits per position over its legal actions; uniform where a position has none yet."""

    def __init__(self) -> None:
        self.logits: dict[Key, np.ndarray] = {}

    def probs(self, key: Key, legal: Sequence[int]) -> np.ndarray:
        logits = self.logits.get(key)
        if logits is None:
            return np.full(len(legal), 1.0 / len(legal))
        p = np.exp(logits - logits.max())
        return p / p.sum()


def score_vs_random(policy: TablePolicy) -> float:
    """Exact expected score of `policy` against the uniformly random mover, mean of both seats."""
    memo: dict[tuple[Key, int], float] = {}

    def value(state, me: int) -> float:
        key = (str(state), me)
        if key not in memo:
            if state.is_terminal():
                memo[key] = 0.5 + 0.5 * state.returns()[me]
            else:
                legal = state.legal_actions()
                mine = state.current_player() == me
                p = policy.probs(str(state), legal) if mine else np.full(len(legal), 1 / len(legal))
                memo[key] = sum(pa * value(state.child(a), me) for a, pa in zip(legal, p))
        return memo[key]

    root = GAME.new_initial_state()
    return 0.5 * (value(root, 0) + value(root, 1))


def play(seats: tuple[TablePolicy | None, TablePolicy | None], rng: np.random.Generator):
    """One game; None is the random mover. Returns per seat its turns [(position, action, legal
    actions)] and the returns."""
    state, turns = GAME.new_initial_state(), ([], [])
    while not state.is_terminal():
        me, legal = state.current_player(), state.legal_actions()
        p = seats[me].probs(str(state), legal) if seats[me] is not None else np.full(len(legal), 1 / len(legal))
        action = legal[rng.choice(len(legal), p=p)]
        turns[me].append((str(state), action, tuple(legal)))
        state.apply_action(action)
    return turns, state.returns()


def matches(policy: TablePolicy, count: int, self_play: float, rng: np.random.Generator):
    """The learner's turns of `count` games: each seat it held, [(position, action, legal actions)] and its return."""
    out = []
    for _ in range(count):
        other = policy if rng.random() < self_play else None
        seats = (policy, other) if rng.random() < 0.5 else (other, policy)
        turns, returns = play(seats, rng)
        out.extend((turns[seat], returns[seat]) for seat in (0, 1) if seats[seat] is policy)
    return out


def mmd_run(games: int, seed: int, alpha: float = 0.5, eta: float = 1.0, per_update: int = 32,
            self_play: float = 0.8) -> float:
    """text_smmd's answer-level step on a table, uniform magnet, critic = mean return seen."""
    rng, policy = np.random.default_rng(seed), TablePolicy()
    total, count = defaultdict(float), defaultdict(int)
    for _ in range(games // per_update):
        seen = {}
        for turns, ret in matches(policy, per_update, self_play, rng):
            for key, action, legal in turns:
                total[key, action] += ret
                count[key, action] += 1
                seen[key] = legal
        for key, legal in seen.items():
            q = np.array([total[key, a] / count[key, a] if count[key, a] else 0.0 for a in legal])
            log_pi, log_rho = np.log(policy.probs(key, legal)), np.full(len(legal), -np.log(len(legal)))
            policy.logits[key] = (log_pi + alpha * eta * log_rho + eta * q) / (1 + alpha * eta)
    return score_vs_random(policy)


def fqi_run(games: int, seed: int, tau: float = 0.1, per_update: int = 32, self_play: float = 0.8,
            sweeps: int = 5) -> float:
    """Fitted Q iteration over every transition seen (to the learner's next position), softmax(Q / tau).
    A seat moves at most 5 times, so 5 sweeps reach the fixed point from any start."""
    rng, policy = np.random.default_rng(seed), TablePolicy()
    transitions, legal_at = [], {}
    q: dict[tuple[Key, int], float] = {}
    for _ in range(games // per_update):
        for turns, ret in matches(policy, per_update, self_play, rng):
            for k, (key, action, legal) in enumerate(turns):
                following = turns[k + 1][0] if k + 1 < len(turns) else None
                transitions.append((key, action, ret if following is None else 0.0, following))
                legal_at[key] = legal
        for _ in range(sweeps):
            targets = defaultdict(list)
            for key, action, reward, following in transitions:
                if following is None:
                    targets[key, action].append(reward)
                else:
                    known = [q[following, a] for a in legal_at[following] if (following, a) in q]
                    targets[key, action].append(max(known, default=0.0))
            q = {k: float(np.mean(v)) for k, v in targets.items()}
        for key, legal in legal_at.items():
            policy.logits[key] = np.array([q.get((key, a), 0.0) for a in legal]) / tau
    return score_vs_random(policy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, nargs="+", default=[640, 1920])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    print(f"uniform policy against the random mover: {score_vs_random(TablePolicy()):.3f}")
    for games in args.games:
        for name, run in (("mmd", mmd_run), ("fqi", fqi_run)):
            scores = [run(games, seed) for seed in range(args.seeds)]
            print(f"{games:>6} games  {name}: " + "  ".join(f"{s:.3f}" for s in scores)
                  + f"  (mean {np.mean(scores):.3f})", flush=True)


if __name__ == "__main__":
    main()
