"""The program that runs INSIDE the sandbox for Python-folder and snapshot submissions.

    python -m ludus.arena.agent_host --folder DIR --entry module:attr      # a Python folder
    python -m ludus.arena.agent_host --snapshot DIR                        # a league snapshot
    python -m ludus.arena.agent_host --mixture DIR                         # a mixture (league output policy)
    python -m ludus.arena.agent_host --check (--folder DIR --entry E | --snapshot DIR | --mixture DIR) [--game ID]

It loads the agent and speaks the JSON-lines protocol (arena/protocol.py) on stdin/stdout. Before
loading anything it moves the protocol to a private descriptor and points file descriptor 1 at
stderr, so an agent's ``print`` calls end up in its stderr log instead of breaking the protocol.

A Python folder's entry point is either a class, instantiated once per process, or a function
used as ``act``. Its ``act(observation, legal_actions, ...)`` gets the observation as a numpy
array of the game's observation shape and the legal action ids as a list of ints, and returns
one of them: an integer (a Python ``int`` or a numpy integer such as ``np.int64``; any
`numbers.Integral` but a bool). Anything else (``"4"``, ``4.7``, ``4.0``, ``True``, a numpy array)
is not coerced: the host passes it on as it is, and the arena records the move as ``INVALID``
(`action_line`). It may also accept any of these keyword arguments, passed when its signature
names them: ``seat``, ``rng`` (a numpy Generator seeded from ``start.seed``, this seat's seed of the
match), ``time_left_s``, ``match``. A class may define ``start(seat, seed)`` and
``end(returns, seat)``; its constructor may accept ``game``, ``num_actions``,
``observation_shape`` and ``seed``.

``--check`` loads the agent and prints one JSON line ``{"ok": true, "name": ...}`` or
``{"ok": false, "error": "..."}``: the arena runs it in a sandbox at submit time.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import numbers
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ludus.arena import protocol
from ludus.text import one_line

ACT_KEYWORDS = ("seat", "rng", "time_left_s", "match")
INIT_KEYWORDS = ("game", "num_actions", "observation_shape", "seed")


def _accepted(fn: Callable, names: tuple[str, ...]) -> tuple[str, ...]:
    """Which of `names` a callable takes as keyword arguments."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return names
    return tuple(n for n in names if n in params and params[n].kind != inspect.Parameter.POSITIONAL_ONLY)


def answer_line(value: Any, text_moves: bool) -> bytes:
    """The protocol line answering ``act``: in a text-move game a str is a text move, anything
    else goes through `action_line`."""
    if text_moves and isinstance(value, str):
        return protocol.encode_move(value[:protocol.MAX_MOVE_CHARS])
    return action_line(value)


def action_line(value: Any) -> bytes:
    """The protocol line answering ``act`` with what an agent's ``act()`` returned.

    An integer (`numbers.Integral`, which numpy integers are, bools excepted) is the action. Any
    other value is not converted (``int("4")``, ``int(4.7)`` and ``int(True)`` would each make a
    move the agent did not give): it is sent as the JSON value it is, or as its repr when JSON has
    none, so the arena's decoder refuses it and records the move INVALID as for any agent."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return protocol.encode_action(int(value))
    try:  # a stranger's __repr__ may itself fail; the move is invalid either way
        described = repr(value)[:200]
    except Exception:
        described = f"<{type(value).__name__} object>"
    if isinstance(value, (str, bool)) or value is None or (isinstance(value, float) and math.isfinite(value)):
        shown: Any = value[:200] if isinstance(value, str) else value
    else:
        shown = described
    print(f"agent_host: act() returned {one_line(described)} ({one_line(type(value).__name__)}); an action is "
          f"an integer (int or numpy integer)", file=sys.stderr, flush=True)
    line = json.dumps({"type": "action", "action": shown}, ensure_ascii=True, separators=(",", ":"))
    return (line + "\n").encode("ascii")


class FolderPlayer:
    """A Python folder's entry point, adapted to the protocol."""

    def __init__(self, folder: Path, entry: str, hello: protocol.Hello | None):
        module_name, _, attr = entry.partition(":")
        sys.path.insert(0, str(folder))
        target = getattr(importlib.import_module(module_name), attr)
        if inspect.isclass(target):
            info = {} if hello is None else {"game": hello.game, "num_actions": hello.num_actions,
                                             "observation_shape": hello.observation_shape, "seed": hello.seed}
            wanted = _accepted(target, INIT_KEYWORDS)
            self.agent: Any = target(**{k: info[k] for k in wanted if k in info})
            act = getattr(self.agent, "act", None)
            self._start = getattr(self.agent, "start", None)
            self._end = getattr(self.agent, "end", None)
        else:
            self.agent, act, self._start, self._end = None, target, None, None
        if not callable(act):
            raise TypeError(f"entry point {entry!r} is neither an act function nor a class with an act method")
        self._act = act
        self._act_keywords = _accepted(act, ACT_KEYWORDS)
        manifest = folder / "agent.toml"
        self.name = tomllib.loads(manifest.read_text())["name"] if manifest.exists() else entry

    def start(self, seat: int, seed: int) -> None:
        if callable(self._start):
            self._start(seat, seed)

    def act(self, observation: np.ndarray, legal: list[int], extras: dict[str, Any]) -> int:
        return self._act(observation, legal, **{k: extras[k] for k in self._act_keywords})

    def end(self, returns: tuple[float, ...], seat: int) -> None:
        if callable(self._end):
            self._end(list(returns), seat)


class PolicyPlayer:
    """A Ludus policy played through the protocol (sampling from it with the match's rng)."""

    def __init__(self, policy: Any, spec: Any, name: str):
        self.policy, self.spec, self.name = policy, spec, name

    def start(self, seat: int, seed: int) -> None:
        pass

    def act(self, observation: np.ndarray, legal: list[int], extras: dict[str, Any]) -> int:
        from ludus.agents.policy import ActBatch

        mask = np.zeros((1, self.spec.num_actions), dtype=bool)
        mask[0, legal] = True
        obs = observation.astype(self.spec.observation_dtype, copy=False)[None]
        batch = ActBatch(obs, mask, np.array([extras["seat"]]))
        out = self.policy.act(batch, extras["rng"])
        if out.texts is not None and out.texts[0] is not None:
            return out.texts[0]  # a text agent's move in a text-move game
        return int(out.actions[0])

    def end(self, returns: tuple[float, ...], seat: int) -> None:
        pass


def snapshot_player(path: Path, game: str | None) -> PolicyPlayer:
    """A league snapshot played by its policy (`ludus.agents.snapshot.policy_from_snapshot`): a net
    sampling from its masked policy, or a language model answering through the game's text view
    on a base model the host ships (shared read-only with the sandbox, `SandboxConfig.shared_paths`)."""
    import torch

    from ludus.agents.snapshot import policy_from_snapshot, verify_snapshot
    from ludus.games import registry

    torch.set_num_threads(1)
    ref = verify_snapshot(path)
    # an LM of several games plays the one it was entered for (`game`), through that game's own view
    return PolicyPlayer(policy_from_snapshot(path, expect_game=game), registry.spec(game or ref.game_id),
                        f"snapshot-{ref.snapshot_id[:12]}")


class MixturePlayer(PolicyPlayer):
    """A mixture checkpoint (agents/mixture.py): each match, one component drawn by weight from a
    generator of its own seeded by ``start.seed`` plays the whole match."""

    def __init__(self, path: Path, game: str | None):
        import torch

        from ludus.agents.mixture import load_mixture_policy
        from ludus.games import registry

        torch.set_num_threads(1)
        mixture = load_mixture_policy(path, expect_game=game)
        super().__init__(mixture, registry.spec(mixture.mixture.game_id),
                         f"mixture-of-{len(mixture.policies)}")

    def start(self, seat: int, seed: int) -> None:
        # not the acting rng's stream: the draw must not shift the match's action samples
        self.policy.start_game(np.random.default_rng([seed, 1]))


def _load(args: argparse.Namespace, hello: protocol.Hello | None) -> FolderPlayer | PolicyPlayer:
    if args.snapshot:
        return snapshot_player(Path(args.snapshot), hello.game if hello else args.game)
    if args.mixture:
        return MixturePlayer(Path(args.mixture), hello.game if hello else args.game)
    return FolderPlayer(Path(args.folder), args.entry, hello)


def _protocol_streams() -> tuple[Any, Any]:
    """Keep the protocol on private descriptors; fd 1 (print) goes to stderr from now on."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    return os.fdopen(fd_in, "rb", buffering=1 << 16), os.fdopen(fd_out, "wb", buffering=0)


def serve(args: argparse.Namespace) -> int:
    reader, writer = _protocol_streams()
    message = protocol.decode_arena_line(reader.readline())
    if not isinstance(message, protocol.Hello):
        raise protocol.ProtocolError(f"expected 'hello' first, got {type(message).__name__}")
    hello = message
    player = _load(args, hello)
    writer.write(protocol.encode_ready(player.name[:protocol.MAX_NAME_CHARS]))
    shape = hello.observation_shape
    seat, rng, match = hello.seat, np.random.default_rng(hello.seed), ""
    while True:
        line = reader.readline()
        if not line:
            return 0
        message = protocol.decode_arena_line(line)
        if isinstance(message, protocol.Act):
            observation = np.asarray(message.observation).reshape(shape)
            extras = {"seat": seat, "rng": rng, "time_left_s": message.time_left_s, "match": message.match}
            writer.write(answer_line(player.act(observation, list(message.legal_actions), extras),
                                     hello.text_moves))
        elif isinstance(message, protocol.Start):
            seat, rng, match = message.seat, np.random.default_rng(message.seed), message.match
            player.start(seat, message.seed)
        elif isinstance(message, protocol.End):
            player.end(message.returns, message.seat)
        elif isinstance(message, protocol.Shutdown):
            return 0
        else:
            raise protocol.ProtocolError(f"unexpected {type(message).__name__} message in match {match!r}")


def check(args: argparse.Namespace) -> int:
    """Load the agent and report, as one JSON line, whether it worked."""
    try:
        hello = None
        if args.game:
            from ludus.games import registry

            spec = registry.spec(args.game)
            hello = protocol.Hello(args.game, 0, 0, 1.0, 0.0, spec.num_actions, spec.observation_shape)
        player = _load(args, hello)
    except BaseException as exc:  # the report IS the purpose: any failure of a stranger's code
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {first}"[:500]}), flush=True)
        return 0
    print(json.dumps({"ok": True, "name": player.name}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ludus.arena.agent_host", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--folder", help="a Python folder submission")
    source.add_argument("--snapshot", help="a league snapshot directory")
    source.add_argument("--mixture", help="a mixture checkpoint directory (a league's output policy)")
    parser.add_argument("--entry", help="module:attribute of the folder's agent")
    parser.add_argument("--game", help="game id (for --check)")
    parser.add_argument("--check", action="store_true", help="load the agent, print one JSON line, exit")
    args = parser.parse_args(argv)
    if args.folder and not args.entry:
        parser.error("--folder needs --entry")
    return check(args) if args.check else serve(args)


if __name__ == "__main__":
    sys.exit(main())
