"""Confidence intervals for win rates.

The Wilson score interval (Wilson 1927) is used instead of the normal approximation because it
stays inside [0, 1] and behaves at 0/n and n/n, which is exactly where a fresh snapshot or a
lopsided pairing sits. Callers count a draw as half a win (`successes = wins + draws / 2`), so
`successes` may be fractional; decayed payoff counts make `n` fractional too, and the formula
accepts both.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

_ROUNDING_SLACK = 1e-9  # relative overshoot of successes over n tolerated as floating-point rounding


def wilson_interval(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate; (0.0, 1.0) when there are no trials.

    Args:
        successes: number of successes (wins + draws / 2), 0 <= successes <= n.
        n: number of trials (may be a decayed, fractional count).
        z: standard-normal quantile of the two-sided confidence level (1.96 = 95%).
    """
    if 0 < successes - n <= _ROUNDING_SLACK * n:
        successes = n  # decayed counts: wins + draws/2 may overshoot games by rounding
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p_hat = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    center = (p_hat + z2 / (2.0 * n)) / denominator
    half_width = z * math.sqrt(p_hat * (1.0 - p_hat) / n + z2 / (4.0 * n * n)) / denominator
    return max(0.0, center - half_width), min(1.0, center + half_width)


def wilson_intervals(
    successes: ArrayLike, n: ArrayLike, z: float = 1.96
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised `wilson_interval` over arrays of (successes, n); entries with n == 0 get (0, 1)."""
    successes = np.asarray(successes, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    successes = np.where((successes > n) & (successes - n <= _ROUNDING_SLACK * n), n, successes)
    if np.any(n < 0) or np.any(successes < 0) or np.any(successes > n):
        raise ValueError("need 0 <= successes <= n elementwise")
    has_trials = n > 0
    safe_n = np.where(has_trials, n, 1.0)
    p_hat = successes / safe_n
    z2 = z * z
    denominator = 1.0 + z2 / safe_n
    center = (p_hat + z2 / (2.0 * safe_n)) / denominator
    half_width = z * np.sqrt(p_hat * (1.0 - p_hat) / safe_n + z2 / (4.0 * safe_n * safe_n)) / denominator
    lower = np.where(has_trials, np.maximum(0.0, center - half_width), 0.0)
    upper = np.where(has_trials, np.minimum(1.0, center + half_width), 1.0)
    return lower, upper
