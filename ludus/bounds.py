"""The valid range of a numeric config field, declared beside it.

    gamma: float = field(default=0.99, metadata=bounds(0, 1))
    \"\"\"Discount factor.\"\"\"

`ludus.league.configio.from_dict` checks every field that declares one (a tuple of numbers: each
item), so a value outside is refused in one line naming the full key before anything runs, and
`ludus config show` prints the range beside the key. This module sits below every package
(agents declare ranges, league checks them) and imports nothing of Ludus.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

RANGE_KEY = "ludus_range"
"""The key of a field's `metadata` that holds its `Range`."""


@dataclass(frozen=True)
class Range:
    """low <= value <= high, either end open (excluded) or absent (None: unbounded). NaN is in no range."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.low is None:
            if value == -math.inf:
                return False
        elif value < self.low or (self.low_open and value == self.low):
            return False
        if self.high is None:
            return value != math.inf
        return not (value > self.high or (self.high_open and value == self.high))

    def __str__(self) -> str:
        low = "-inf" if self.low is None else _number(self.low)
        high = "inf" if self.high is None else _number(self.high)
        left = "(" if self.low is None or self.low_open else "["
        right = ")" if self.high is None or self.high_open else "]"
        return f"{left}{low}, {high}{right}"


def _number(x: float) -> str:
    """A bound as it is declared: 2**63 and 10**6, not 9223372036854775808 and 1000000.0."""
    if isinstance(x, float) and x.is_integer() and abs(x) >= 10**4:
        x = int(x)
    if isinstance(x, int) and x >= 2**20 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    if isinstance(x, int) and x >= 10**4 and str(x).rstrip("0") == "1":
        return f"10**{len(str(x)) - 1}"
    return str(x)


def bounds(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> dict[str, Range]:
    """`metadata` of a dataclass field whose value (each item, for a tuple) must lie in the range."""
    return {RANGE_KEY: Range(low, high, low_open, high_open)}


def range_of(f: dataclasses.Field) -> Range | None:
    """The declared range of a dataclass field, or None."""
    return f.metadata.get(RANGE_KEY)


def range_problem(f: dataclasses.Field, value: Any, key: str, given: Any = None) -> str | None:
    """A one-line message when `value` (a number, a tuple of numbers or None) is outside the
    range `f` declares, else None. `given`: the value as the user wrote it (before conversion)."""
    declared = range_of(f)
    if declared is None or value is None:
        return None
    items = value if isinstance(value, (tuple, list)) else (value,)
    for item in items:
        if item not in declared:
            shown = _shown(value if given is None else given)
            return (f"{key}={shown} is outside its range {declared}: set a value inside it "
                    f"(`ludus config show` lists every key's range)")
    return None


def _shown(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

