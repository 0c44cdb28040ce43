"""Connect four random self-play speed: the native batched engine against PettingZoo and pyspiel.

Every workload plays uniformly random legal moves and, per move, produces what a learner needs
(observation and legal mask of the seat to move):

(a) native: ``registry.make_vector("connect_four", B)``; one call steps B boards and returns the
    full TimeStep ([B, 2, 3, 6, 7] float32 observations, [B, 2, 7] masks, rewards, auto-reset);
    actions are the argmax of masked random floats, vectorised (included in the timing);
(b) PettingZoo ``connect_four_v3.env()``, the usual AEC loop (``last()`` then ``step``);
(c) the pyspiel adapter ``games.spiel`` through the Game protocol (observation, legal_mask, step).

The three run interleaved, repeat after repeat, so that load from other processes hits all of
them alike; each figure is the median over repeats. Rates count board moves (calls to step that
place a stone). The goal compares (a) with (b): 300x PettingZoo is ~3.2M moves/s on a machine
where (b) does ~10.6k (see shared/REFERENCE.md).

    python benchmarks/game_speed.py [--boards 8192] [--repeats 5] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

GOAL_RATIO = 300.0


def native_connect_four(num_boards: int, seconds: float, rng: np.random.Generator, state: dict) -> tuple[float, float]:
    """Moves/s of random self-play on the batched engine, with and without the action choice."""
    from games import registry

    if "vec" not in state:
        state["vec"] = registry.make_vector("connect_four", num_boards, seed=0)
        state["ts"] = state["vec"].reset(np.arange(num_boards))
        for _ in range(20):  # warm-up: caches, allocator, games at every depth
            state["ts"] = _native_step(state["vec"], state["ts"], rng)[0]
    vec, ts = state["vec"], state["ts"]
    steps, in_engine = 0, 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            ts, engine_seconds = _native_step(vec, ts, rng)
            in_engine += engine_seconds
        steps += 10
    elapsed = time.perf_counter() - start
    state["ts"] = ts
    return steps * num_boards / elapsed, steps * num_boards / in_engine


def _native_step(vec, ts, rng: np.random.Generator):
    legal = ts.mask[:, 0] | ts.mask[:, 1]  # the acting seat's row; the other row is all False
    scores = rng.random(legal.shape, dtype=np.float32)
    scores *= legal
    action = np.argmax(scores, axis=1)
    actions = np.broadcast_to(action[:, None], (vec.num_games, 2))  # the non-acting entry is ignored
    start = time.perf_counter()
    ts = vec.step(actions)
    return ts, time.perf_counter() - start


def pettingzoo_connect_four(seconds: float, rng: np.random.Generator, state: dict) -> float:
    from pettingzoo.classic import connect_four_v3

    if "env" not in state:
        state["env"] = connect_four_v3.env()
        state["env"].reset(seed=0)
    env = state["env"]
    moves = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=int(rng.integers(2**31)))
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, info = env.last()
            if terminated or truncated:
                action = None
            else:
                legal = np.flatnonzero(obs["action_mask"])
                action = int(legal[rng.integers(len(legal))])
                moves += 1
            env.step(action)
    return moves / (time.perf_counter() - start)


def spiel_connect_four(seconds: float, rng: np.random.Generator) -> tuple[float, str]:
    """Moves/s through the pyspiel adapter, or through raw pyspiel if the adapter is absent."""
    try:
        from games.spiel import make_spiel_game
    except ModuleNotFoundError as exc:
        if exc.name != "games.spiel":
            raise
        return _raw_spiel(seconds, rng), "raw pyspiel (games.spiel absent): apply_action + legal_actions + observation_tensor"
    from games.core import is_over

    game = make_spiel_game("connect_four")
    game.reset(0)
    moves = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            seat = game.to_move()[0]
            game.observation(seat)
            legal = np.flatnonzero(game.legal_mask(seat))
            game.step({seat: int(legal[rng.integers(len(legal))])})
            moves += 1
            if is_over(game):
                game.reset(int(rng.integers(2**31)))
    return moves / (time.perf_counter() - start), "games.spiel adapter: observation + legal_mask + step"


def _raw_spiel(seconds: float, rng: np.random.Generator) -> float:
    import pyspiel

    spiel_game = pyspiel.load_game("connect_four")
    state = spiel_game.new_initial_state()
    moves = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            state.observation_tensor(state.current_player())
            legal = state.legal_actions()
            state.apply_action(legal[rng.integers(len(legal))])
            moves += 1
            if state.is_terminal():
                state = spiel_game.new_initial_state()
    return moves / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boards", type=int, default=8192, help="boards per native step call")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median reported)")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per workload per repeat")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    native_state: dict = {}
    pz_state: dict = {}
    native, native_engine, pettingzoo, spiel = [], [], [], []
    spiel_label = ""
    for repeat in range(args.repeats + 1):  # repeat 0 is a warm-up and is not counted
        full, engine = native_connect_four(args.boards, args.seconds, rng, native_state)
        pz = pettingzoo_connect_four(args.seconds, rng, pz_state)
        sp, spiel_label = spiel_connect_four(args.seconds, rng)
        if repeat:
            native.append(full), native_engine.append(engine), pettingzoo.append(pz), spiel.append(sp)
            print(f"repeat {repeat}: native {full / 1e6:.2f}M/s  pettingzoo {pz / 1e3:.1f}k/s  "
                  f"spiel {sp / 1e3:.0f}k/s", flush=True)
    native_rate, engine_rate = float(np.median(native)), float(np.median(native_engine))
    pz_rate, spiel_rate = float(np.median(pettingzoo)), float(np.median(spiel))
    print(f"(a) native connect four, {args.boards} boards, random legal play: {native_rate / 1e6:.2f}M moves/s "
          f"({1e9 / native_rate:.0f} ns/move; engine step alone {engine_rate / 1e6:.2f}M moves/s, "
          f"including [B,2,3,6,7] float32 obs + [B,2,7] masks)")
    print(f"(b) PettingZoo connect_four_v3.env() random legal loop: {pz_rate / 1e3:.1f}k moves/s")
    print(f"(c) {spiel_label}: {spiel_rate / 1e3:.1f}k moves/s")
    print(f"native / pyspiel: {native_rate / spiel_rate:.0f}x")
    ratio = native_rate / pz_rate
    verdict = "PASS" if ratio >= GOAL_RATIO else "FAIL"
    print(f"goal engine_vs_pettingzoo: {ratio:.0f}x (target {GOAL_RATIO:.0f}x) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
