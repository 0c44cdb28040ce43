"""Games by id.

Ids are either a registered native name (``connect_four``, ``tic_tac_toe``, ``negotiation``)
or an adapter prefix followed by the foreign name:

* ``spiel:<pyspiel game string>`` e.g. ``spiel:goofspiel(num_cards=4)``
* ``pz:<module path of a PettingZoo env>`` e.g. ``pz:pettingzoo.classic.connect_four_v3``
* ``gym:<Gymnasium env id>`` e.g. ``gym:CartPole-v1``
* ``ta:<TextArena env id>`` e.g. ``ta:SimpleNegotiation-v0`` (games/adapters/textarena.py: every two-player game)
* ``mix:<id>|<id>@<weight>`` several games as one, each match drawn from its seed (games/mix.py)

Each prefix is one `GameAdapter` record in `ADAPTERS` (the adapter modules are named by module
path and imported on first use); `register_adapter` adds one from outside the package.

Native names may take parameters the same way: ``negotiation(max_utterances=4)``.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ludus.games.core import Game, GameError, GameSpec, LoopVectorGame, VectorGame


@dataclass(frozen=True)
class GameEntry:
    """A registered native game."""

    name: str
    make: Callable[..., Game]
    """Builds one game from keyword parameters."""
    make_vector: Callable[..., VectorGame] | None
    """Builds a natively batched version: make_vector(num_games, seed, **params); None to loop."""
    summary: str
    layout: str = ""
    """What an observation holds, entry by entry, and what each action number means (for
    authors of arena agents; `ludus games --describe ID` prints it)."""


@dataclass(frozen=True)
class Lazy:
    """A callable named by module path ("module:attr"), imported on its first call: the tables
    below reach the adapters' and kinds' modules this way, so importing the table imports none of
    them (pyspiel, PettingZoo, TextArena load only for the ids that need them) and no module of
    the table's family imports back into it."""

    target: str
    """"package.module:function"."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _load(self.target)(*args, **kwargs)


@dataclass(frozen=True)
class GameAdapter:
    """One adapter prefix: how ``prefix:rest`` ids reach another library's games (OpenSpiel's
    ``pyspiel.registered_names`` is the model: one record per kind, one table, looked up by name).
    Every hook takes the id's `rest` (the part after ``prefix:``) or a game the adapter built."""

    prefix: str
    """What an id starts with, before the colon ("spiel")."""
    form: str
    """How an id of this adapter is written, for error messages and help ("spiel:NAME")."""
    reaches: str
    """The library the adapter reaches, as people name it ("OpenSpiel")."""
    make: Callable[[str], Game]
    """Builds one game from `rest`; raises GameError with a one-line message on a bad name."""
    summary: str = ""
    """One line for `ludus games` and docs: what `rest` names."""
    make_vector: Callable[[str, int, int], VectorGame] | None = None
    """make_vector(rest, num_games, seed): natively batched games; None to loop over `make`."""
    spec: Callable[[str], GameSpec] | None = None
    """The facts of `rest` without a game to step; None builds one with `make` and reads its spec."""
    resolves_by_import: bool = False
    """Whether `rest` is a module path the adapter imports (PettingZoo modules, Gymnasium's
    ``module:Env``): such ids are the operator's to name, never a stranger's submission
    (arena/submission.py). False where the library looks names up in a table it already has."""
    text_view: Callable[[str], Any] | None = None
    """text_view(rest) -> the `ludus.games.text.TextView` of every game of this adapter (TextArena's
    games are text already); None when none has one (`ludus.games.text.TEXT_VIEWS` may still list
    single ids such as ``spiel:kuhn_poker``)."""
    layout: Callable[[Game], list[str]] | None = None
    """Lines for `ludus games --describe`: what the observation holds and what each action number
    means, read from the built game; None for the generic text of adapted environments."""
    examples: tuple[str, ...] = ()
    """Full ids `ludus games` lists and the conformance tests run over."""
    game_tree: bool = False
    """Whether every id of this adapter names an OpenSpiel game whose whole tree the exact methods
    walk (`spiel_game_for`): Deep CFR, text MMD's tables, PSRO's exact meta-game, exact
    exploitability. They ask `reaches_game_tree`, never the prefix."""
    stale_snapshot: Callable[[str, tuple[int, ...]], str] | None = None
    """stale_snapshot(rest, saved observation shape) -> why a snapshot that read observations of
    that shape cannot play `rest` now ('' if it can): for an adapter that changed what its ids
    read; None where it never did (`snapshot_shape_problem`)."""


ADAPTERS: dict[str, GameAdapter] = {}
"""The adapters by prefix: the only place a prefix is looked up. `register_adapter` adds one."""


def register_adapter(adapter: GameAdapter) -> None:
    """Add a game adapter at run time (a test's toy game, a plugin's library); its ids are
    ``adapter.prefix:rest`` everywhere a game id is taken. Refuses a prefix already taken."""
    if not isinstance(adapter, GameAdapter):
        raise GameError(f"register_adapter takes a GameAdapter, got {type(adapter).__name__}")
    if not adapter.prefix.isidentifier() or adapter.prefix in ADAPTERS:
        raise GameError(f"game adapter prefix {adapter.prefix!r} is taken or not a plain name "
                        f"(taken: {', '.join(ADAPTERS)})")
    ADAPTERS[adapter.prefix] = adapter


for _adapter in (
    GameAdapter("spiel", "spiel:NAME", "OpenSpiel", Lazy("ludus.games.adapters.spiel:make_spiel_game"),
                summary="any OpenSpiel game by its pyspiel game string, e.g. spiel:goofspiel(num_cards=4)",
                layout=Lazy("ludus.games.adapters.spiel:describe_layout"), game_tree=True,
                stale_snapshot=Lazy("ludus.games.adapters.spiel:stale_snapshot"),
                text_view=Lazy("ludus.games.adapters.spiel_text:spiel_text_view"),
                examples=("spiel:tic_tac_toe", "spiel:connect_four", "spiel:kuhn_poker", "spiel:leduc_poker",
                          "spiel:goofspiel(num_cards=4)", "spiel:kuhn_poker(players=3)")),
    GameAdapter("pz", "pz:MODULE", "PettingZoo", Lazy("ludus.games.adapters.pz:make_pettingzoo_game"),
                summary="a PettingZoo environment by module path, e.g. pz:pettingzoo.classic.connect_four_v3",
                resolves_by_import=True,
                examples=("pz:pettingzoo.classic.tictactoe_v3", "pz:pettingzoo.classic.texas_holdem_v4",
                          "pz:mpe2.simple_spread_v3")),
    GameAdapter("gym", "gym:ID", "Gymnasium", Lazy("ludus.games.adapters.gym:make_gym_game"),
                summary="a single-agent Gymnasium environment by id, e.g. gym:CartPole-v1",
                resolves_by_import=True, examples=("gym:CartPole-v1",)),
    GameAdapter("ta", "ta:ID", "TextArena", Lazy("ludus.games.adapters.textarena:make_textarena_game"),
                summary="a two-player TextArena game by env id (free-text moves judged by the game), e.g. ta:SimpleNegotiation-v0",
                text_view=Lazy("ludus.games.adapters.textarena:textarena_view"),
                layout=Lazy("ludus.games.adapters.textarena:describe_layout"),
                examples=("ta:TicTacToe-v0", "ta:KuhnPoker-v0", "ta:SimpleNegotiation-v0")),
    # A mix may name ``pz:``/``gym:`` ids, which import modules: only the operator names one.
    GameAdapter("mix", "mix:ID|ID@WEIGHT", "several games", Lazy("ludus.games.mix:make_mix_game"),
                summary="several games as one, each match the game its seed draws by weight (config key games:), "
                        "e.g. mix:ta:TicTacToe-v0|ta:KuhnPoker-v0@2",
                spec=Lazy("ludus.games.mix:mix_game_spec"), resolves_by_import=True,
                text_view=Lazy("ludus.games.mix:mix_text_view"), layout=Lazy("ludus.games.mix:describe_layout"),
                examples=("mix:tic_tac_toe|connect_four",)),
):
    register_adapter(_adapter)
del _adapter


_NATIVE: dict[str, GameEntry] = {}
_ID_RE = re.compile(r"^(?P<name>[A-Za-z_][\w\-.]*)(\((?P<params>.*)\))?$")


def register(name: str, make: Callable[..., Game], make_vector: Callable[..., VectorGame] | None = None,
             summary: str = "", layout: str = "") -> None:
    """Register a native game under `name` at run time (see docs/games.md, 'Adding a game'; an
    installed package uses the ``ludus.games`` entry-point group instead)."""
    _ensure_builtin()
    if name in _NATIVE:
        raise GameError(f"game {name!r} is already registered")
    _NATIVE[name] = GameEntry(name, make, make_vector, summary, layout)
    REGISTERED_BY[name] = sys._getframe(1).f_globals.get("__name__", "")


REGISTERED_BY: dict[str, str] = {}
"""Game name -> the module whose code called `register` ('__main__' for a script): a league run
records it as its `game_module`, so `ludus` commands can import it (league/config.py)."""


BUILTIN_GAMES = {
    "connect_four": "ludus.games.builtin.native:CONNECT_FOUR_ENTRY",
    "tic_tac_toe": "ludus.games.builtin.native:TIC_TAC_TOE_ENTRY",
    "simple_tag": "ludus.games.builtin.tag:SIMPLE_TAG_ENTRY",
    "negotiation": "ludus.games.builtin.negotiation:NEGOTIATION_ENTRY",
    "negotiation_turns": "ludus.games.builtin.negotiation_turns:NEGOTIATION_TURNS_ENTRY",
    "signalling": "ludus.games.builtin.signalling:SIGNALLING_ENTRY",
    "teams": "ludus.games.builtin.teams:TEAMS_ENTRY",
}
"""Ludus's own games as entry points ("module:attr" naming a `GameEntry`), loaded on first use.
Other installed packages add theirs under the entry-point group ``ludus.games`` (pyproject:
``[project.entry-points."ludus.games"] my_game = "my_package.games:ENTRY"``). Only the host's
own code and installed packages are named here; a game id never names a module."""
ENTRY_POINT_GROUP = "ludus.games"
_loaded = False


def _ensure_builtin() -> None:
    """Load the built-in games and the installed packages' entry points (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from importlib.metadata import entry_points

    targets = dict(BUILTIN_GAMES)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        targets.setdefault(point.name, point.value)
    for name, target in targets.items():
        entry = _load(target)
        if not isinstance(entry, GameEntry) or entry.name != name:
            raise GameError(f"game entry point {name!r} = {target!r} is not a GameEntry named {name!r}")
        _NATIVE[name] = entry


def _load(target: str) -> Any:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def parse_params(text: str, game_id: str) -> dict[str, Any]:
    """Parse ``a=1,b=x,c=0.5`` into typed values (int, float, bool, str)."""
    params: dict[str, Any] = {}
    if not text.strip():
        return params
    for part in text.split(","):
        if "=" not in part:
            raise GameError(f"bad parameter {part!r} in game id {game_id!r}: use name(key=value,...)")
        key, value = (s.strip() for s in part.split("=", 1))
        if not key.isidentifier():
            raise GameError(f"bad parameter name {key!r} in game id {game_id!r}")
        params[key] = _parse_value(value)
    return params


def _parse_value(value: str) -> Any:
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def native_entry(game_id: str) -> GameEntry | None:
    """The registered entry of a native game id (parameters allowed), None for adapter ids."""
    prefix, rest = _split(game_id)
    return None if prefix is not None else _native(rest)[0]


def native_names() -> list[str]:
    _ensure_builtin()
    return sorted(_NATIVE)


def _split(game_id: str) -> tuple[str | None, str]:
    if not isinstance(game_id, str) or not game_id.strip():
        raise GameError("empty game id: try `ludus games` for the list")
    prefix, sep, rest = game_id.partition(":")
    if sep and "(" not in prefix:  # a colon inside parameters belongs to them: teams(game=spiel:kuhn_poker)
        if prefix not in ADAPTERS:
            close = difflib.get_close_matches(prefix, list(ADAPTERS), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}:?)" if close else ""
            raise GameError(f"unknown game prefix {prefix!r} in {game_id!r}{hint}: use one of "
                            f"{', '.join(p + ':' for p in ADAPTERS)} or a native name")
        if not rest:
            raise GameError(f"game id {game_id!r} names no game after {prefix!r}")
        return prefix, rest
    return None, game_id


def adapter_for(game_id: str) -> GameAdapter | None:
    """The adapter record of an adapter id (``spiel:kuhn_poker``), None for a native id; a one-line
    GameError for an unknown prefix."""
    prefix, _ = _split(game_id)
    return None if prefix is None else ADAPTERS[prefix]


def resolves_by_import(game_id: str) -> bool:
    """Whether building `game_id` imports a module that the id itself names.

    ``pz:`` ids are module paths and ``gym:`` ids may be ``module:Env`` (Gymnasium imports the
    module), so such an id is only ever taken from the operator, never from a stranger's
    submission (arena/submission.py). Native, ``spiel:`` and ``ta:`` ids resolve among games the
    host already has (pyspiel looks its games up in its own compiled table, TextArena in its
    registry, and games/adapters/textarena.py adapts only the families it lists)."""
    adapter = adapter_for(game_id)
    return adapter is not None and adapter.resolves_by_import


def reaches_game_tree(game_id: str) -> bool:
    """Whether `game_id` names an OpenSpiel game whose whole tree the exact methods walk
    (`GameAdapter.game_tree`); False for native ids and for ids that name no adapter."""
    try:
        adapter = adapter_for(game_id)
    except GameError:  # not an adapter id at all: no tree to walk (whoever builds it says why)
        return False
    return adapter is not None and adapter.game_tree


def snapshot_shape_problem(game_id: str, observation_shape: tuple[int, ...]) -> str:
    """Why a snapshot that read observations of `observation_shape` cannot play `game_id` now, when
    the id's adapter changed what its ids read (`GameAdapter.stale_snapshot`); '' otherwise."""
    try:
        adapter = adapter_for(game_id)
    except GameError:
        return ""
    if adapter is None or adapter.stale_snapshot is None:
        return ""
    return adapter.stale_snapshot(_split(game_id)[1], tuple(observation_shape))


def make(game_id: str) -> Game:
    """Build one game from its id; raises GameError with a one-line message on a bad id."""
    prefix, rest = _split(game_id)
    if prefix is not None:
        return ADAPTERS[prefix].make(rest)
    entry, params = _native(rest)
    try:
        return entry.make(**params)
    except TypeError as exc:
        raise GameError(f"bad parameters for game {entry.name!r}: {exc}") from None


def make_vector(game_id: str, num_games: int, seed: int = 0) -> VectorGame:
    """B games stepped per call: natively batched where the game has it, else a loop."""
    prefix, rest = _split(game_id)
    if prefix is None:
        entry, params = _native(rest)
        if entry.make_vector is not None:
            try:
                return entry.make_vector(num_games=num_games, seed=seed, **params)
            except TypeError as exc:
                raise GameError(f"bad parameters for game {entry.name!r}: {exc}") from None
    elif ADAPTERS[prefix].make_vector is not None:
        return ADAPTERS[prefix].make_vector(rest, num_games, seed)
    make(game_id)  # fail on a bad id before building B copies
    return LoopVectorGame(lambda: make(game_id), num_games, seed=seed)


def spec(game_id: str) -> GameSpec:
    prefix, rest = _split(game_id)
    if prefix is not None and ADAPTERS[prefix].spec is not None:
        return ADAPTERS[prefix].spec(rest)
    return make(game_id).spec


def _native(text: str) -> tuple[GameEntry, dict[str, Any]]:
    _ensure_builtin()
    match = _ID_RE.match(text.strip())
    if not match:
        raise GameError(f"malformed game id {text!r}: use name or name(key=value,...)")
    name = match.group("name")
    if name not in _NATIVE:
        close = difflib.get_close_matches(name, list(_NATIVE), n=3, cutoff=0.5)
        if not close and _is_spiel_name(name):
            close = [f"spiel:{name}"]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        forms, libraries = [a.form for a in ADAPTERS.values()], [a.reaches for a in ADAPTERS.values()]
        raise GameError(f"unknown game {name!r}{hint} (`ludus games` lists them; "
                        f"{_and(forms)} reach {_and(libraries)})")
    return _NATIVE[name], parse_params(match.group("params") or "", text)


def _and(words: list[str]) -> str:
    """"a, b and c"."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _is_spiel_name(name: str) -> bool:
    import pyspiel

    return name in pyspiel.registered_names()


EXAMPLE_IDS: tuple[str, ...] = tuple(game_id for adapter in ADAPTERS.values() for game_id in adapter.examples)
"""Games `ludus games` lists beyond the native ones (the built-in adapters' examples), and the set
check_game is run over in tests."""


def listed_ids() -> list[str]:
    """Every id `ludus games` shows: native games, then the examples of every registered adapter."""
    return native_names() + [game_id for adapter in ADAPTERS.values() for game_id in adapter.examples]
