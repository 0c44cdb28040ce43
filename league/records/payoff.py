"""The league's payoff table: decayed win/draw/game counts per ordered pair of players.

As in AlphaStar (Vinyals et al. 2019, pseudo-code `Payoff._update`), the decay is applied per
game of a pair: before a game between A and B is counted, that pair's counts (both orientations)
are multiplied by `decay`; other pairs are untouched. A pair's counts therefore remember roughly
its last 1 / (1 - decay) games however rarely it is played, and replaying the ledger in order
reproduces the table exactly (no dependence on iteration boundaries).

Win probabilities use a Beta(1, 1) prior, P[A beats B] = (wins + draws/2 + 1) / (games + 2), so a
pair that has played zero, one or two games never gets a PFSP weight of exactly zero or one.

Storage is three dense float64 matrices indexed by a player's entry order, grown by doubling
their capacity: adding a player costs amortised O(N) cells (one row and column), lookups of a
whole row are one numpy fancy-index. 1,000 players take 24 MB.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ludus.league.records.ledger import MatchResult, Store
from ludus.league.records.player_index import PlayerIndex


class PayoffTable(PlayerIndex):
    """Decayed head-to-head counts between players, growable as the population grows."""

    def __init__(self, decay: float = 0.99):
        """Args:
            decay: factor in (0, 1] applied to a pair's counts before each of its games (1 = no decay).
        """
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        super().__init__()
        self.decay = float(decay)
        capacity = 16
        self._wins = np.zeros((capacity, capacity))   # _wins[a, b]: decayed wins of a against b
        self._draws = np.zeros((capacity, capacity))  # symmetric
        self._games = np.zeros((capacity, capacity))  # symmetric

    def add(self, player_id: str) -> int:
        """Enter a player (no-op if present) and return its row index."""
        i = self._index.get(player_id)
        if i is not None:
            return i
        i = len(self._ids)
        capacity = self._wins.shape[0]
        if i == capacity:
            for name in ("_wins", "_draws", "_games"):
                grown = np.zeros((2 * capacity, 2 * capacity))
                grown[:capacity, :capacity] = getattr(self, name)
                setattr(self, name, grown)
        self._index[player_id] = i
        self._ids.append(player_id)
        return i

    # -- updates -------------------------------------------------------------------------------

    def update(self, home: str, away: str, outcome: float) -> None:
        """Count one game of `home` against `away`; `outcome` is home's score (1, 0.5 or 0)."""
        self.update_pairs([(home, away, outcome)])

    def update_pairs(self, games: Iterable[tuple[str, str, float]]) -> None:
        """Count games (home, away, home's score) in order; same result as one `update` per game."""
        # Group by unordered pair, keeping each pair's game order, then run that pair's decay
        # recurrence in Python floats and write the matrices once per pair.
        per_pair: dict[tuple[int, int], list[float]] = {}
        for home, away, outcome in games:
            if home == away:
                raise ValueError(f"a player cannot be counted against itself ({home!r})")
            if outcome not in (0.0, 0.5, 1.0):
                raise ValueError(f"outcome must be 0, 0.5 or 1, got {outcome}")
            a, b = self.add(home), self.add(away)
            if a < b:
                per_pair.setdefault((a, b), []).append(outcome)
            else:
                per_pair.setdefault((b, a), []).append(1.0 - outcome)
        decay = self.decay
        for (a, b), outcomes in per_pair.items():
            wins_ab = float(self._wins[a, b])
            wins_ba = float(self._wins[b, a])
            draws = float(self._draws[a, b])
            played = float(self._games[a, b])
            for outcome in outcomes:
                wins_ab = wins_ab * decay + (1.0 if outcome == 1.0 else 0.0)
                wins_ba = wins_ba * decay + (1.0 if outcome == 0.0 else 0.0)
                draws = draws * decay + (1.0 if outcome == 0.5 else 0.0)
                played = played * decay + 1.0
            self._wins[a, b], self._wins[b, a] = wins_ab, wins_ba
            self._draws[a, b] = self._draws[b, a] = draws
            self._games[a, b] = self._games[b, a] = played

    def update_matches(self, matches: Iterable[MatchResult]) -> None:
        """Count every pair of seats on different teams played by different players.

        A pair's outcome compares the two teams' outcomes (higher wins, equal draws); matches in
        which every seat failed are skipped.
        """
        self.update_pairs(pair_results(matches))

    # -- queries -------------------------------------------------------------------------------

    def counts(self, home: str, away: str) -> tuple[float, float, float]:
        """(wins, draws, games) of home against away, decayed; zeros for unknown players."""
        a, b = self._index.get(home), self._index.get(away)
        if a is None or b is None:
            return 0.0, 0.0, 0.0
        return float(self._wins[a, b]), float(self._draws[a, b]), float(self._games[a, b])

    def win_prob(self, home: str, away: str) -> float:
        """P[home beats away] = (wins + draws/2 + 1) / (games + 2)."""
        wins, draws, games = self.counts(home, away)
        return (wins + draws / 2 + 1.0) / (games + 2.0)

    def _rows(self, player_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        index = np.fromiter((self._index.get(p, -1) for p in player_ids), dtype=np.int64, count=len(player_ids))
        return index, index >= 0

    def totals(self, home: str, aways: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-opponent (wins, draws, games) arrays of home against each of `aways` (zeros if unknown)."""
        n = len(aways)
        wins, draws, games = np.zeros(n), np.zeros(n), np.zeros(n)
        a = self._index.get(home)
        if a is None:
            return wins, draws, games
        index, known = self._rows(aways)
        cols = index[known]
        wins[known] = self._wins[a, cols]
        draws[known] = self._draws[a, cols]
        games[known] = self._games[a, cols]
        return wins, draws, games

    def win_probs(self, home: str, aways: Sequence[str]) -> np.ndarray:
        """P[home beats b] for each b in `aways`, vectorised (0.5 for pairs never played)."""
        wins, draws, games = self.totals(home, aways)
        return (wins + draws / 2 + 1.0) / (games + 2.0)

    def win_prob_matrix(self, player_ids: Sequence[str]) -> np.ndarray:
        """M[i, j] = P[player_ids[i] beats player_ids[j]] (0.5 on the diagonal and for unknowns)."""
        index, known = self._rows(player_ids)
        safe = np.where(known, index, 0)
        both = known[:, None] & known[None, :]
        wins = np.where(both, self._wins[np.ix_(safe, safe)], 0.0)
        draws = np.where(both, self._draws[np.ix_(safe, safe)], 0.0)
        games = np.where(both, self._games[np.ix_(safe, safe)], 0.0)
        return (wins + draws / 2 + 1.0) / (games + 2.0)

    # -- serialisation -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Exact JSON form: the decay, the players in entry order and every pair that has games."""
        n = len(self._ids)
        a_idx, b_idx = np.nonzero(np.triu(self._games[:n, :n] > 0, k=1))
        pairs = [[int(a), int(b), float(self._wins[a, b]), float(self._wins[b, a]), float(self._draws[a, b]),
                  float(self._games[a, b])] for a, b in zip(a_idx, b_idx)]
        return {"decay": self.decay, "players": list(self._ids), "pairs": pairs}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PayoffTable":
        table = cls(decay=float(data["decay"]))
        for player_id in data["players"]:
            table.add(player_id)
        for a, b, wins_ab, wins_ba, draws, games in data["pairs"]:
            table._wins[a, b], table._wins[b, a] = wins_ab, wins_ba
            table._draws[a, b] = table._draws[b, a] = draws
            table._games[a, b] = table._games[b, a] = games
        return table


def pair_results(matches: Iterable[MatchResult]) -> Iterable[tuple[str, str, float]]:
    """(home, away, home's score) for every cross-team pair of distinct players, in seat order."""
    for match in matches:
        if not match.has_result:
            continue
        seats = match.seats
        for i, home in enumerate(seats):
            for away in seats[i + 1:]:
                if home.team == away.team or home.player_id == away.player_id:
                    continue
                if home.outcome > away.outcome:
                    score = 1.0
                elif home.outcome < away.outcome:
                    score = 0.0
                else:
                    score = 0.5
                yield home.player_id, away.player_id, score


def rebuild_payoff(store: Store, decay: float, kinds: Iterable[str] = ("training", "rating")) -> PayoffTable:
    """Replay the ledger's matches of `kinds` in seq order into a fresh table (exact)."""
    table = PayoffTable(decay)
    chunk: list[MatchResult] = []
    for recorded in store.iter_matches(kinds=tuple(kinds)):
        chunk.append(recorded.result)
        if len(chunk) == 10_000:  # bound memory; chunking does not change the result
            table.update_matches(chunk)
            chunk = []
    table.update_matches(chunk)
    return table
