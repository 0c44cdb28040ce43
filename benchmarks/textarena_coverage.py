"""How many of TextArena's two-player games Ludus plays: `check_game` on the default variant of each.

The pool is every game family registered in TextArena (``textarena==0.7.4``) that two players can
play: the families built on TextArena's two-player state class, and the multi-player families
that start with two players here. Each family's default variant is its ``-v0`` id (else its first
registered id). A family counts when ``ludus games --check ta:ID`` passes on it (the same
checker, fewer games: TextArena games step in milliseconds, not microseconds) and not every
checked game ended with the game's own error; a refusal or a failure is printed as the one line
the checker gives.

    python3 benchmarks/textarena_coverage.py [--games 6]

Ends with ``goal textarena_two_player_coverage: N (target 45) PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

TARGET = 45


def families() -> dict[str, str]:
    """Family name -> its default variant's env id, for every family two players can play."""
    import textarena as ta

    from ludus.games.adapters.textarena import _offline, _refusal  # noqa: F401 (the adapter's own quieting)

    by_family: dict[str, list[str]] = {}
    points: dict[str, str] = {}
    for env_id, entry in ta.envs.registration.ENV_REGISTRY.items():
        point = entry.entry_point if isinstance(entry.entry_point, str) else \
            f"{entry.entry_point.__module__}:{entry.entry_point.__name__}"
        family = point.split(":")[0].split(".")[-2]
        by_family.setdefault(family, []).append(env_id)
        points[family] = point.split(":")[0]
    root = Path(inspect.getfile(ta)).parent
    pool = {}
    for family, ids in sorted(by_family.items()):
        source = root.joinpath(*points[family].split(".")[1:]).with_suffix(".py")
        text = source.read_text(encoding="utf-8") if source.exists() else ""
        default = next((i for i in ids if i.endswith("-v0")), ids[0])
        if "TwoPlayerState" in text or ("MultiPlayerState" in text and _accepts_two(default)):
            pool[family] = default
    return pool


def _accepts_two(env_id: str) -> bool:
    """A multi-player family counts when it starts with two players here (one that fails for a
    missing piece cannot say whether two may play it, and is left out)."""
    import textarena as ta

    from ludus.games.adapters.textarena import _offline

    try:
        with _offline():
            env = ta.make(env_id)
            env.reset(num_players=2, seed=0)
        return True
    except Exception:  # the family's own check of its player count, or a missing piece
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, default=6, help="random games the checker plays per game (default 6)")
    args = parser.parse_args()

    from ludus.errors import UserError
    from ludus.games.check import GameCheckError, check_game

    pool = families()
    print(f"TextArena two-player families: {len(pool)}")
    passed, refused = [], []
    for family, env_id in pool.items():
        start = time.perf_counter()
        try:
            report = check_game(f"ta:{env_id}", num_games=args.games, num_replays=2, num_vector_games=2)
        except (UserError, GameCheckError) as exc:
            line = " ".join(str(exc).split())
            refused.append((family, line))
            print(f"  no   {env_id:32s} {line[:200]}", flush=True)
            continue
        if report.num_failed == report.num_games:
            refused.append((family, "the game itself failed in every checked game"))
            print(f"  no   {env_id:32s} the game itself failed (raised or hung) in all {report.num_games} games",
                  flush=True)
            continue
        passed.append(family)
        print(f"  ok   {env_id:32s} {report.num_steps:5d} steps, {report.num_terminal} ended by rules, "
              f"{report.num_failed} failed, {time.perf_counter() - start:5.1f} s", flush=True)
    print(f"passed: {', '.join(passed)}")
    print(f"refused: {', '.join(f for f, _ in refused)}")
    verdict = "PASS" if len(passed) >= TARGET else "FAIL"
    print(f"goal textarena_two_player_coverage: {len(passed)} of {len(pool)} (target {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
