"""Speed of the league core: TrueSkill updates, opponent sampling, payoff, ledger writes.

Measures, in one run:
  * two-player TrueSkill updates/s: `trueskill.rate_1vs1` (factor graph) vs the exact closed form
    (`ludus.league.records.ratings.rate_1vs1`) vs the batched numpy form (`rate_1vs1_batch`);
  * the league core's cost for one batch with a 1,000-player pool: draw 1,024 opponents (PFSP +
    self-play + uniform), count 1,024 training results in the payoff table, schedule and rate 256
    rating games, and append all 1,280 matches to the SQLite ledger.

The goal is the speed-up of the exact fast path over `trueskill.rate_1vs1` (target 10x).

    python benchmarks/ratings_speed.py
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np
import trueskill

from ludus.league.records.ledger import MatchResult, SeatResult, Store
from ludus.league.records.matchmaking import MatchmakingMix, sample_opponents, schedule_rating_matches
from ludus.league.records.payoff import PayoffTable
from ludus.league.records.ratings import Rating, RatingTable, TrueSkillParams, rate_1vs1, rate_1vs1_batch, rate_and_record


def per_second(fn, count: int, repeats: int = 3) -> float:
    """Median throughput of `fn()`, which performs `count` operations per call."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def median_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def one_vs_one(rng: np.random.Generator) -> None:
    params = TrueSkillParams()
    env = params.env
    n = 4000
    mu1, mu2 = rng.normal(25, 5, n), rng.normal(25, 5, n)
    s1, s2 = rng.uniform(0.5, 8, n), rng.uniform(0.5, 8, n)
    drawn = rng.random(n) < 0.1
    pairs = [(trueskill.Rating(a, b), trueskill.Rating(c, d), bool(e)) for a, b, c, d, e in zip(mu1, s1, mu2, s2, drawn)]
    ours = [(Rating(float(a), float(b)), Rating(float(c), float(d)), bool(e)) for a, b, c, d, e in zip(mu1, s1, mu2, s2, drawn)]

    def with_trueskill():
        for a, b, e in pairs[:1000]:
            trueskill.rate_1vs1(a, b, drawn=e, env=env)

    def closed_form():
        for a, b, e in ours:
            rate_1vs1(a, b, e, params)

    big = 1_000_000
    bmu1, bmu2 = rng.normal(25, 5, big), rng.normal(25, 5, big)
    bs1, bs2 = rng.uniform(0.5, 8, big), rng.uniform(0.5, 8, big)
    bdrawn = rng.random(big) < 0.1

    def batched():
        rate_1vs1_batch(bmu1, bs1, bmu2, bs2, bdrawn, params)

    rate_trueskill = per_second(with_trueskill, 1000)
    rate_closed = per_second(closed_form, n)
    rate_batched = per_second(batched, big)
    print(f"trueskill.rate_1vs1      {rate_trueskill:>12,.0f} updates/s")
    print(f"exact closed form        {rate_closed:>12,.0f} updates/s  ({rate_closed / rate_trueskill:.1f}x)")
    print(f"batched numpy            {rate_batched:>12,.0f} updates/s  ({rate_batched / rate_trueskill:.0f}x)")
    return rate_closed / rate_trueskill


def league_batch(rng: np.random.Generator) -> None:
    params = TrueSkillParams()
    pool = [f"snapshot-{i}" for i in range(1000)]
    ratings = RatingTable(params)
    payoff = PayoffTable(decay=0.99)
    for k in range(5000):  # a populated league: every snapshot has ratings and payoff entries
        a, b = rng.choice(1000, size=2, replace=False)
        m = _match(k, pool[a], pool[b], float(rng.random() < 0.5), "rating")
        ratings.update(m)
        payoff.update_matches([m])
    for i in range(0, 1000, 3):
        payoff.update("main", pool[i], float(rng.integers(3)) / 2)
    mix = MatchmakingMix(self_play=0.35, pfsp=0.5, uniform=0.15)
    next_id = [10_000]

    def sample():
        return sample_opponents(rng, mix, "main", pool, payoff, ratings, 1024)

    opponents = sample()
    training = [_match(10_000 + k, "main", o, float(rng.random() < 0.5), "training") for k, o in enumerate(opponents)]

    def payoff_update():
        payoff.update_matches(training)

    def schedule():
        return schedule_rating_matches(rng, ratings, pool, 256)

    rating_pairs = schedule()
    rated = [_match(20_000 + k, a, b, float(rng.random() < 0.5), "rating") for k, (a, b) in enumerate(rating_pairs)]

    def rate():
        for m in rated:
            ratings.update(m)

    ms_sample = median_ms(sample)
    ms_payoff = median_ms(payoff_update)
    ms_schedule = median_ms(schedule)
    ms_rate = median_ms(rate)
    with tempfile.TemporaryDirectory() as tmp:
        with Store.open(tmp) as store:
            def record():
                batch = [_match(next_id[0] + k, m.seats[0].player_id, m.seats[1].player_id, m.seats[0].outcome,
                                m.kind) for k, m in enumerate(training + rated)]
                next_id[0] += len(batch)
                rate_and_record(store, ratings, batch)
            ms_record = median_ms(record)
    print("1,000-player pool, one batch of 1,024 training + 256 rating games:")
    print(f"  sample 1,024 opponents          {ms_sample:7.2f} ms")
    print(f"  payoff update, 1,024 results    {ms_payoff:7.2f} ms")
    print(f"  schedule 256 rating games       {ms_schedule:7.2f} ms")
    print(f"  rate 256 games (RatingTable)    {ms_rate:7.2f} ms")
    print(f"  rate + record 1,280 in SQLite   {ms_record:7.2f} ms (incl. building MatchResults)")
    print(f"  league core total               {ms_sample + ms_payoff + ms_schedule + ms_rate + ms_record:7.2f} ms")


def _match(match_id: int, first: str, second: str, first_outcome: float, kind: str) -> MatchResult:
    return MatchResult(match_id=match_id, kind=kind, game_id="connect_four", seed=match_id, length=20,
                       started_at=0.0, duration_s=0.01,
                       seats=(SeatResult(0, 0, first, 2 * first_outcome - 1, first_outcome),
                              SeatResult(1, 1, second, 1 - 2 * first_outcome, 1 - first_outcome)))


def main() -> None:
    rng = np.random.default_rng(0)
    speedup = one_vs_one(rng)
    league_batch(rng)
    target = 10.0
    print(f"goal ratings_speed: {speedup:.1f}x (target {target:.0f}x) {'PASS' if speedup >= target else 'FAIL'}")


if __name__ == "__main__":
    main()
