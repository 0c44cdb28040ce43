"""The learner kinds of a league: one frozen record per kind and one table of them.

`LeagueConfig.learner` names a row of this table; the config's validation asks the row
(`LearnerKind.validate` and its flags), `ludus.league.learners.learning` builds learners and
policy architectures through it, and `ludus.league.check.check_learner` runs over every row
(tests/test_learner_kinds.py). Code outside Ludus adds a kind with `register_learner_kind`
(tests/toy_learner.py does, without editing a project file), as OpenSpiel registers games.

Rule: this module imports no learner at module level and never `ludus.league.config` (the config
imports it): each built-in kind's constructor imports its learner's module when called.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Callable

from ludus.games import registry
from ludus.league.configio import ConfigError

# The callables below take a `ludus.league.config.LeagueConfig` (named `config`), a game's
# `GameSpec` and a `ludus.league.learners.ranks.RankGroup`; not imported here, the config imports this.
MakeLearner = Callable[..., Any]
"""`make(spec, config, role_index, seed, init_seed, ranks) -> LeagueLearner`."""


def _no_checks(config: Any) -> None:
    """A kind with nothing of its own to check."""


@dataclass(frozen=True)
class LearnerKind:
    """One kind of league learner: everything the config, the league and the checkers ask of it."""

    name: str
    """The value of `LeagueConfig.learner` that picks this kind, e.g. 'ppo'."""
    summary: str
    """One line for people: what it trains and on which games (`ludus config show`, errors)."""
    settings: tuple[str, ...]
    """The config blocks it reads, e.g. ('ppo', 'net'): where to look to tune it, and what a
    section-wise `config show` prints for it."""
    make: MakeLearner
    """The constructor of its `LeagueLearner`: `make(spec, config, role_index, seed, init_seed, ranks)`
    (`ranks`: a data-parallel `RankGroup` or None). Imports its learner's module when called, so the
    table stays cheap to import and the config can import it."""
    architecture: Callable[[Any], Any]
    """`architecture(config)`: the `PolicyArchitecture` of its policies with the league's settings,
    without building a learner (an evaluation plays a run's frozen members with it)."""
    validate: Callable[[Any], None] = _no_checks
    """`validate(config)`: its own checks of a `LeagueConfig`, raising a one-line `ConfigError`;
    the general checks (and the flags below) stay in `LeagueConfig.__post_init__`."""
    uses_net: bool = False
    """Trains the actor-critic `net` (so a role may have its own `roles[i].net`)."""
    net_head: tuple[str, str] | None = None
    """(head, why): the `net.head` this kind needs, and why; every other kind refuses that head."""
    text_lm: str | None = None
    """A pretrained-LM learner: the `text_lm.<block>` of its own settings (the other LM kinds'
    blocks are refused when set; anchor 'base', the untrained base LM, needs such a kind)."""
    deepspeed: bool = False
    """May update through `learner_backend.backend 'deepspeed'` (never silently replaced by torch Adam)."""
    data_parallel: bool = False
    """May train on `learner_backend.ranks > 1` data-parallel ranks."""


_KINDS: dict[str, LearnerKind] = {}
"""The table: kind name -> record, in registration order (errors and docs list kinds in it)."""


def register_learner_kind(kind: LearnerKind) -> LearnerKind:
    """Add `kind` to the table (code outside Ludus: a plugin, a test); a name already taken is refused."""
    if kind.name in _KINDS:
        raise ValueError(f"learner kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def learner_kind(name: str) -> LearnerKind:
    """The kind named `name`, or a one-line `ConfigError` with the closest name and the choices."""
    kind = _KINDS.get(name)
    if kind is None:
        close = difflib.get_close_matches(str(name), list(_KINDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"config key 'learner': {name!r} is not a learner kind{hint}; kinds: {', '.join(_KINDS)}")
    return kind


def learner_kinds() -> tuple[LearnerKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(_KINDS.values())


def text_lm_learners() -> dict[str, str]:
    """The pretrained-LM kinds, each with the `text_lm` block of its settings."""
    return {kind.name: kind.text_lm for kind in _KINDS.values() if kind.text_lm}


def spoken(names: list[str] | tuple[str, ...]) -> str:
    """'a' / 'a' and 'b' / 'a', 'b' and 'c': names in a sentence."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def changed_keys(settings: Any, read: frozenset[str] = frozenset()) -> list[str]:
    """The keys of a settings dataclass (e.g. `ppo`) set away from their defaults that a learner
    reading only `read` ignores."""
    default = type(settings)()
    return [f.name for f in fields(settings) if f.name not in read and getattr(settings, f.name) != getattr(default, f.name)]


# ------------------------------------------------------------------ the built-in kinds


def _make_ppo(spec, config, role_index: int, seed: int, init_seed: int, ranks=None):
    from ludus.league.learners.base import make_ppo_learner

    if ranks is not None:
        from ludus.league.learners.ranks import RankedLearner

        return RankedLearner(ranks, role_index, seed, init_seed,
                             lambda: make_ppo_learner(spec, config, role_index, seed, init_seed))
    return make_ppo_learner(spec, config, role_index, seed, init_seed)


def _actor_critic_architecture(config):
    from ludus.league.learners.base import ActorCriticArchitecture

    return ActorCriticArchitecture(config.net)


def _validate_ppo(config) -> None:
    if config.learner_backend.backend == "deepspeed":
        from ludus.agents.deepspeed_backend import micro_batch_size

        micro_batch_size(config.learner_backend, config.ppo.minibatch_size)  # fixed-size minibatches agree


def _make_mappo(spec, config, role_index: int, seed: int, init_seed: int, ranks=None, *, critic_input: str):
    from ludus.league.learners.mappo import MAPPOLeagueLearner

    return MAPPOLeagueLearner(spec, config, config.role_net(role_index), seed, init_seed, critic_input=critic_input)


def _mappo_architecture(config, *, critic_input: str):
    from ludus.league.learners.mappo import MAPPOArchitecture, mappo_config

    return MAPPOArchitecture(config.net, mappo_config(config, critic_input))


def _validate_mappo(config) -> None:
    from ludus.league.learners.mappo import PPO_KEYS_MAPPO_READS

    # e.g. ppo.minibatch_size: MAPPO splits each update into ppo.num_minibatches
    unread = changed_keys(config.ppo, read=PPO_KEYS_MAPPO_READS)
    if unread:
        raise ConfigError(f"learner {config.learner!r} does not use ppo.{unread[0]} (it reads ppo."
                          f"{', ppo.'.join(sorted(PPO_KEYS_MAPPO_READS))}); drop it or use learner 'ppo'")


def _make_token_ppo(spec, config, role_index: int, seed: int, init_seed: int, ranks=None):
    from ludus.league.learners.dialogue import TokenPPOLeagueLearner

    return TokenPPOLeagueLearner(spec, config, role_index, seed, init_seed)


def _token_lm_architecture(config):
    from ludus.league.learners.dialogue import LMArchitecture

    return LMArchitecture(config.dialogue.lm)


def _make_text(class_name: str):
    def make(spec, config, role_index: int, seed: int, init_seed: int, ranks=None):
        from ludus.league.learners import text_lm

        return getattr(text_lm, class_name)(spec, config, role_index, seed, init_seed)

    make.__name__ = f"make_{class_name}"
    return make


def _text_lm_architecture(config):
    from ludus.league.learners.text_lm import TextLMArchitecture

    return TextLMArchitecture(config.text_lm.model, config.text_lm.play)


def _validate_text_lm(own: Callable[[Any], None] = _no_checks) -> Callable[[Any], None]:
    """The checks of every pretrained-LM kind around `own`, the kind's own."""

    def validate(config) -> None:
        from ludus.games.text import TEXT_VIEWS, has_text_view

        if not has_text_view(config.game):
            raise ConfigError(f"learner {config.learner!r} plays games with a text view; {config.game!r} has none "
                              f"(games with one: {', '.join(sorted(TEXT_VIEWS))} and TextArena's, ta:ID)")
        own(config)
        blocks = text_lm_learners()
        for learner, block in blocks.items():
            changed = changed_keys(getattr(config.text_lm, block))
            if config.learner != learner and changed:
                raise ConfigError(f"learner {config.learner!r} does not use text_lm.{block}.{changed[0]} (its settings "
                                  f"are text_lm.{blocks[config.learner]}.*); drop it")

    return validate


def _validate_text_ppo(config) -> None:
    if config.learner_backend.backend == "deepspeed":
        from ludus.agents.deepspeed_backend import text_micro_batch_size

        text_micro_batch_size(config.learner_backend, config.text_lm.ppo.micro_batch_size)


def _validate_text_mmd(config) -> None:
    if not registry.reaches_game_tree(config.game):
        raise ConfigError(f"learner 'text_mmd' reads OpenSpiel game trees; {config.game!r} is not a spiel: game "
                          f"(use learner 'text_smmd', which reads only play)")
    if not config.text_lm.play.prompt.response_prefix:
        raise ConfigError("learner 'text_mmd' reads the answer at the response's first token: it needs "
                          "text_lm.play.prompt.response_prefix (e.g. '[')")


def _validate_text_exit(config) -> None:
    from ludus.league.learners.text_lm import EXIT_GAMES

    if config.game not in EXIT_GAMES:
        raise ConfigError(f"learner 'text_exit' searches positions rebuilt from the observation: games "
                          f"{', '.join(EXIT_GAMES)}, not {config.game!r} (use learner 'text_smmd')")


def _make_text_smmd(spec, config, role_index: int, seed: int, init_seed: int, ranks=None):
    from ludus.league.learners.text_smmd import TextSMMDLeagueLearner

    return TextSMMDLeagueLearner(spec, config, role_index, seed, init_seed)


def _make_sdcfr(spec, config, role_index: int, seed: int, init_seed: int, ranks=None):
    from ludus.league.learners.cfr import SDCFRLeagueLearner

    return SDCFRLeagueLearner(spec, config, config.role_net(role_index), seed, init_seed)


def _validate_sdcfr(config) -> None:
    if not registry.reaches_game_tree(config.game):
        raise ConfigError(f"learner 'sdcfr' traverses OpenSpiel game trees; {config.game!r} is not a spiel: game")
    if any(role.reset_every_snapshots for role in config.roles):
        raise ConfigError("learner 'sdcfr' does not reset to a snapshot (CFR's iterates build on all earlier "
                          "ones); set reset_every_snapshots 0")
    changed = changed_keys(config.ppo)
    if changed:
        raise ConfigError(f"learner 'sdcfr' does not use ppo.{changed[0]} (its settings are cfr.*); drop it")


PPO = register_learner_kind(LearnerKind(
    "ppo", "actor-critic nets trained by PPO (any game)", ("net", "ppo", "learner_backend"),
    _make_ppo, _actor_critic_architecture, _validate_ppo, uses_net=True, deepspeed=True, data_parallel=True))
MAPPO = register_learner_kind(LearnerKind(
    "mappo", "a side's shared actor with a centralised critic (team and cooperative games)", ("net", "ppo", "critic"),
    partial(_make_mappo, critic_input="global"), partial(_mappo_architecture, critic_input="global"),
    _validate_mappo, uses_net=True))
IPPO = register_learner_kind(LearnerKind(
    "ippo", "MAPPO with a local critic (the ablation of Yu et al. 2022)", ("net", "ppo", "critic"),
    partial(_make_mappo, critic_input="local"), partial(_mappo_architecture, critic_input="local"),
    _validate_mappo, uses_net=True))
TOKEN_PPO = register_learner_kind(LearnerKind(
    "token_ppo", "tiny LMs on token games (negotiation)", ("dialogue",),
    _make_token_ppo, _token_lm_architecture))
TEXT_PPO = register_learner_kind(LearnerKind(
    "text_ppo", "pretrained LMs through a game's text view, turn-level PPO", ("text_lm", "learner_backend"),
    _make_text("TextLMLeagueLearner"), _text_lm_architecture, _validate_text_lm(_validate_text_ppo),
    text_lm="ppo", deepspeed=True))
TEXT_MMD = register_learner_kind(LearnerKind(
    "text_mmd", "pretrained LMs by magnetic mirror descent on a small OpenSpiel game's exact tree", ("text_lm",),
    _make_text("TextMMDLeagueLearner"), _text_lm_architecture, _validate_text_lm(_validate_text_mmd), text_lm="mmd"))
TEXT_EXIT = register_learner_kind(LearnerKind(
    "text_exit", "pretrained LMs by expert iteration, MCTS over the rules as the expert (tic-tac-toe)", ("text_lm",),
    _make_text("TextExItLeagueLearner"), _text_lm_architecture, _validate_text_lm(_validate_text_exit),
    text_lm="exit"))
TEXT_SMMD = register_learner_kind(LearnerKind(
    "text_smmd", "pretrained LMs on any text game from play alone: sampled MMD on the answers with a learned "
    "critic; on free text PPO-clipped with the base as magnet and role baselines", ("text_lm",),
    _make_text_smmd, _text_lm_architecture, _validate_text_lm(), text_lm="smmd"))
DEFAULT_TEXT_LM_LEARNER = TEXT_SMMD.name
"""The LM learner of a game no preset names (benchmarks/llm_any_game.py, preset `llm_any_game`):
it reads only what the runners record, so it fits any game with a text view; `text_mmd` (small
OpenSpiel games, whose tree it walks) and `text_exit` (games with a simulator to search) are
for the games they suit (docs/llm.md, "Which LM learner when")."""
SDCFR = register_learner_kind(LearnerKind(
    "sdcfr", "Single Deep CFR on two-player OpenSpiel games (a regret-matching net)", ("net", "cfr"),
    _make_sdcfr, _actor_critic_architecture, _validate_sdcfr, uses_net=True,
    net_head=("regret_matching", "the net's outputs are CFR's regrets")))
