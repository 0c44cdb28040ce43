"""Connect four random self-play speed: the native batched engine against PettingZoo and pyspiel.

Every workload plays uniformly random legal moves and, per move, produces what a learner needs
(observation and legal mask of the seat to move):

(a) native: ``registry.make_vector("connect_four", B)``; one call steps B boards and returns the
    full TimeStep ([B, 2, 3, 6, 7] float32 observations, [B, 2, 7] masks, rewards, auto-reset);
    actions are drawn uniformly among the legal ones by whole-array numpy operations
    (`UniformLegalChooser`; included in the timing);
(b) PettingZoo ``connect_four_v3.env()``, the usual AEC loop (``last()`` then ``step``);
(c) the pyspiel adapter ``ludus.games.adapters.spiel`` through the Game protocol (observation, legal_mask, step).

The three run interleaved, repeat after repeat, so that load from other processes hits all of
them alike; each rate is the median over repeats and the goal ratio is the median of the
per-repeat ratios (native and PettingZoo measured back to back). Rates count board moves
(steps that place a stone). The goal compares (a) with (b): 300x PettingZoo is ~3.2M moves/s
on a machine where (b) does ~10.6k (see docs/reference.md).

    python benchmarks/game_speed.py [--boards 8192] [--repeats 5] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

GOAL_RATIO = 300.0


class UniformLegalChooser:
    """A uniformly random legal action per game from a TimeStep's [B, 2, A] masks (A <= 8, one
    seat acting per game) in a few whole-array operations (numpy's row-wise argmax over 7
    columns costs ~18 ns per row, more than a bitboard step).

    A row's 8 mask bytes, read as one little-endian uint64 of 0/1 bytes, times
    0x0102040810204080 has the mask's bits in its top byte (the multiply gathers byte i at bit
    56 + i without carries). With r uniform on [0, lcm(1..A)), r mod n is uniform on [0, n) for
    every count n <= A, so ``table[bits, r]``, the (r mod n)-th legal action, is a uniform legal
    choice."""

    def __init__(self, num_games: int, num_actions: int):
        assert num_actions <= 8
        self.period = int(np.lcm.reduce(np.arange(1, num_actions + 1)))
        table = np.zeros((2**num_actions, self.period), np.int64)
        for bits in range(1, 2**num_actions):
            legal = [a for a in range(num_actions) if (bits >> a) & 1]
            table[bits] = [legal[r % len(legal)] for r in range(self.period)]
        self.table = table.reshape(-1)
        self.padded = np.zeros((num_games, 8), bool)  # each row read as one uint64
        self.num_actions = num_actions

    def __call__(self, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        # the acting seat's row; the other seat's row is all False
        np.logical_or(mask[:, 0], mask[:, 1], out=self.padded[:, : self.num_actions])
        bits = self.padded.view(np.uint64)[:, 0] * np.uint64(0x0102040810204080)
        bits >>= np.uint64(56)
        index = rng.integers(0, self.period, len(mask))
        index += bits.astype(np.int64) * self.period
        return self.table.take(index)


class NativeRun:
    """Random self-play on `num_boards` native connect four boards, stepped together."""

    def __init__(self, num_boards: int, rng: np.random.Generator):
        from ludus.games import registry

        self.vec = registry.make_vector("connect_four", num_boards, seed=0)
        self.choose = UniformLegalChooser(num_boards, self.vec.spec.num_actions)
        self.rng = rng
        self.ts = self.vec.reset(np.arange(num_boards))
        for _ in range(20):  # warm-up: caches, allocator, games at every depth
            self._step()

    def _step(self) -> float:
        """One move on every board; returns the seconds spent inside the engine's step."""
        action = self.choose(self.ts.mask, self.rng)
        actions = np.broadcast_to(action[:, None], (self.vec.num_games, 2))  # non-acting entries are ignored
        start = time.perf_counter()
        self.ts = self.vec.step(actions)
        return time.perf_counter() - start

    def measure(self, seconds: float) -> tuple[float, float]:
        """(moves/s of the whole loop, moves/s counting only the time inside the engine's step)."""
        steps, in_engine = 0, 0.0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(10):
                in_engine += self._step()
            steps += 10
        elapsed = time.perf_counter() - start
        moves = steps * self.vec.num_games
        return moves / elapsed, moves / in_engine


class PettingZooRun:
    """Random self-play in PettingZoo's ``connect_four_v3.env()`` (the wrapped AEC env)."""

    def __init__(self, rng: np.random.Generator):
        from pettingzoo.classic import connect_four_v3

        self.env = connect_four_v3.env()
        self.rng = rng

    def measure(self, seconds: float) -> float:
        env, rng = self.env, self.rng
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
        from ludus.games.adapters.spiel import make_spiel_game
    except ModuleNotFoundError as exc:
        if exc.name != "ludus.games.adapters.spiel":
            raise
        return _raw_spiel(seconds, rng), "raw pyspiel (ludus.games.adapters.spiel absent): apply_action + legal_actions + observation_tensor"
    from ludus.games.core import is_over

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
    return moves / (time.perf_counter() - start), "ludus.games.adapters.spiel adapter: observation + legal_mask + step"


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
    native_run = NativeRun(args.boards, rng)
    pettingzoo_run = PettingZooRun(rng)
    native, native_engine, pettingzoo, spiel = [], [], [], []
    spiel_label = ""
    for repeat in range(args.repeats + 1):  # repeat 0 is a warm-up and is not counted
        full, engine = native_run.measure(args.seconds)
        pz = pettingzoo_run.measure(args.seconds)
        sp, spiel_label = spiel_connect_four(args.seconds, rng)
        if repeat:
            native.append(full), native_engine.append(engine), pettingzoo.append(pz), spiel.append(sp)
            print(f"repeat {repeat}: native {full / 1e6:.2f}M/s  pettingzoo {pz / 1e3:.1f}k/s  "
                  f"spiel {sp / 1e3:.0f}k/s  ratio {full / pz:.0f}x", flush=True)
    native_rate, engine_rate = float(np.median(native)), float(np.median(native_engine))
    pz_rate, spiel_rate = float(np.median(pettingzoo)), float(np.median(spiel))
    print(f"(a) native connect four, {args.boards} boards, random legal play: {native_rate / 1e6:.2f}M moves/s "
          f"({1e9 / native_rate:.0f} ns/move; engine step alone {engine_rate / 1e6:.2f}M moves/s, "
          f"including [B,2,3,6,7] float32 obs + [B,2,7] masks)")
    print(f"(b) PettingZoo connect_four_v3.env() random legal loop: {pz_rate / 1e3:.1f}k moves/s")
    print(f"(c) {spiel_label}: {spiel_rate / 1e3:.1f}k moves/s")
    print(f"native / pyspiel: {native_rate / spiel_rate:.0f}x")
    ratio = float(np.median(np.array(native) / np.array(pettingzoo)))
    verdict = "PASS" if ratio >= GOAL_RATIO else "FAIL"
    print(f"goal engine_vs_pettingzoo: {ratio:.0f}x (target {GOAL_RATIO:.0f}x) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
