"""Player ids in the order they entered a table: the rows of the ratings and payoff tables
(league/records/ratings.py `RatingTable`, league/records/payoff.py `PayoffTable`)."""

from __future__ import annotations


class PlayerIndex:
    """Player ids in the order they entered a table, each with its row (ratings, payoff)."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._ids: list[str] = []

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, player_id: object) -> bool:
        return player_id in self._index

    def players(self) -> list[str]:
        """Player ids in the order they entered the table."""
        return list(self._ids)
