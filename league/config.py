"""The league's configuration: one tree of frozen dataclasses, presets, and validation."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ludus.agents.solvers.deep_cfr import DeepCFRConfig
from ludus.agents.lm.model import TinyLMConfig
from ludus.agents.deepspeed_backend import LearnerBackendConfig
from ludus.agents.nets import NetConfig
from ludus.agents.rl.ppo import PPOConfig
from ludus.agents.lm.pretrained import PretrainedLMConfig
from ludus.agents.lm.text_policy import TextPlayConfig
from ludus.agents.lm.text_exit import TextExItConfig
from ludus.agents.lm.text_mmd import TextMMDConfig
from ludus.agents.lm.text_smmd import TextSMMDConfig
from ludus.agents.lm.text_ppo import TextPPOConfig
from ludus.agents.rl.token_ppo import TokenPPOConfig
from ludus.games import registry
from ludus.league.configio import ConfigError, apply_overrides, from_dict, load_yaml, to_dict
from ludus.league.learners.kinds import learner_kind, learner_kinds, spoken, text_lm_learners
from ludus.bounds import bounds

RoleKind = Literal["main", "main_exploiter", "league_exploiter"]


@dataclass(frozen=True)
class RoleConfig:
    """A learning role of the league (AlphaStar, Vinyals et al. 2019)."""

    name: str = "main"
    """Player id prefix of this role's learners, e.g. 'main' gives learner 'main'."""
    kind: RoleKind = "main"
    """'main' (self-play + PFSP against everyone), 'main_exploiter' (plays the main agents),
    'league_exploiter' (PFSP against the whole league, reset periodically)."""
    learner_share: float = field(default=1.0, metadata=bounds(0, 1e6, low_open=True))
    """Share of each iteration's training matches played by this role (shares are normalised)."""
    self_play: float = field(default=0.35, metadata=bounds(0, 1e6))
    """Weight of self-play (the current learner on every seat) in this role's opponent mix."""
    pfsp: float = field(default=0.5, metadata=bounds(0, 1e6))
    """Weight of prioritised fictitious self-play over the role's candidate opponents."""
    uniform: float = field(default=0.15, metadata=bounds(0, 1e6))
    """Weight of uniform sampling over the role's candidate opponents."""
    meta_nash: float = field(default=0.0, metadata=bounds(0, 1e6))
    """Weight of drawing opponents from the meta-strategy of the population's exact meta-game
    (PSRO, Lanctot et al. 2017; small OpenSpiel games only, see league/psro.py)."""
    meta_solver: Literal["nash", "prd"] = "nash"
    """PSRO's meta-solver: 'nash' (the meta-game's exact Nash mixture) or 'prd' (projected
    replicator dynamics, which keeps `prd_exploration` of the weight spread over every member)."""
    prd_exploration: float = field(default=0.05, metadata=bounds(0, 1, high_open=True))
    """PRD's probability floor gamma (Lanctot et al. 2017 §3.2), in [0, 1)."""
    pfsp_weighting: Literal["hard", "var", "linear"] = "hard"
    """PFSP weighting f(P[learner beats B]): hard (1-x)^p, var x(1-x), linear 1-x."""
    pfsp_power: float = field(default=2.0, metadata=bounds(0, 100))
    """The exponent p of the 'hard' weighting."""
    team: int | None = field(default=None, metadata=bounds(0, 1023))
    """In an asymmetric team game, the side (index of the team, in order of first seat) this role's
    learner always plays, e.g. 0 for the predators of simple_tag; None rotates over all sides."""
    reset_every_snapshots: int = field(default=0, metadata=bounds(0, 10**6))
    """Reset the learner to its initial weights after this many of its snapshots (0 = never;
    AlphaStar resets league exploiters so they keep finding new weaknesses)."""
    snapshot_on_plateau: int = field(default=0, metadata=bounds(0, 10**6))
    """Also freeze the learner once its mean training return has not risen by `plateau_min_gain`
    for this many iterations (0 = off): a PSRO best response is trained until its gain stops, not
    for a fixed step count. The mean is an exponential moving average spanning as many iterations;
    `snapshot_every_steps` stays the cap."""
    plateau_min_gain: float = field(default=0.0, metadata=bounds(0, None))
    """The rise of the smoothed mean return (in the game's return units) that counts as progress."""
    net: NetConfig | None = None
    """This role's own actor-critic architecture (learners 'ppo', 'mappo', 'ippo', 'sdcfr'), e.g.
    wider layers for one side of an asymmetric game; in a config file or `--set`, keys it leaves
    out are the league's `net` (`config_from_dict` completes it). None: the league's `net`."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ConfigError(f"role name {self.name!r} must be alphanumeric (underscores allowed)")
        if self.learner_share <= 0:
            raise ConfigError(f"roles.{self.name}.learner_share must be > 0, got {self.learner_share}")
        weights = (self.self_play, self.pfsp, self.uniform, self.meta_nash)
        if min(weights) < 0 or sum(weights) <= 0:
            raise ConfigError(f"roles.{self.name}: self_play/pfsp/uniform/meta_nash must be >= 0 and not all 0")
        if self.team is not None and (self.team < 0 or self.self_play > 0):
            raise ConfigError(f"roles.{self.name}: a role with a fixed team needs team >= 0 and self_play 0 "
                              f"(its opponents play the other side)")
        if self.reset_every_snapshots < 0:
            raise ConfigError(f"roles.{self.name}.reset_every_snapshots must be >= 0")
        if not 0.0 <= self.prd_exploration < 1.0:
            raise ConfigError(f"roles.{self.name}.prd_exploration must be in [0, 1), got {self.prd_exploration}")
        if self.snapshot_on_plateau < 0 or self.plateau_min_gain < 0:
            raise ConfigError(f"roles.{self.name}: snapshot_on_plateau and plateau_min_gain must be >= 0")


@dataclass(frozen=True)
class LogConfig:
    """Where metrics go."""

    wandb: Literal["offline", "online", "disabled"] = "disabled"
    """wandb mode, the same default for every preset: 'disabled'; 'offline' writes under
    <run>/wandb and needs no key, 'online' uploads (WANDB_API_KEY); either says where in one line
    when the run starts, and wandb itself prints nothing (WANDB_MODE overrides this key)."""
    wandb_project: str = "ludus"
    """wandb project name."""
    tensorboard: bool = True
    """Also write TensorBoard event files under <run>/tensorboard."""
    progress: bool = True
    """Show a progress line (steps/s, games, policy lag, main rating) on stderr."""


@dataclass(frozen=True)
class DialogueConfig:
    """Language-model learners for token games (learner 'token_ppo'; league/learners/dialogue.py, docs/reference.md §4)."""

    lm: TinyLMConfig = field(default_factory=TinyLMConfig)
    """The learners' tiny GPT-2; vocab_size is taken from the game (the model reads its token ids)."""
    token_ppo: TokenPPOConfig = field(default_factory=TokenPPOConfig)
    """Token-level PPO hyperparameters (KL penalty to the imitation model, interleaved imitation batches)."""
    imitation_steps: int = field(default=0, metadata=bounds(0, 10**9))
    """Behaviour-cloning steps on scripted dialogues before league RL (once per learner, before its first
    snapshot; a resume does not repeat them)."""
    imitation_batch_size: int = field(default=64, metadata=bounds(1, 10**6))
    """Dialogue transcripts (one seat's side each) per imitation step."""
    imitation_lr: float = field(default=1e-3, metadata=bounds(0, 1, low_open=True))
    """Adam learning rate of the warm start, annealed linearly to 0 (interleaved batches during RL use token_ppo.lr)."""
    imitation_dialogues: int = field(default=2048, metadata=bounds(0, 10**8))
    """Scripted dialogues generated (seeded) as imitation data; each gives one transcript per seat."""
    imitation_bots: tuple[str, ...] = ("negotiator-fair", "negotiator-tough", "negotiator-soft", "random-split")
    """Demonstrators (bot names); the dialogues are split evenly over every ordered pair of them."""

    def __post_init__(self) -> None:
        for key in ("imitation_steps", "imitation_dialogues"):
            if getattr(self, key) < 0:
                raise ConfigError(f"config key 'dialogue.{key}' must be >= 0, got {getattr(self, key)}")
        if self.imitation_batch_size < 1 or not self.imitation_lr > 0:
            raise ConfigError("config keys 'dialogue.imitation_batch_size' and 'dialogue.imitation_lr' must be > 0")
        if (self.imitation_steps or self.token_ppo.imitation_every) and (
                not self.imitation_bots or self.imitation_dialogues < 1):
            raise ConfigError("imitation needs 'dialogue.imitation_bots' and 'dialogue.imitation_dialogues' >= 1")


@dataclass(frozen=True)
class TextLMConfig:
    """Pretrained language models that play through a game's text view (learners 'text_ppo',
    'text_mmd' and 'text_exit'; docs/llm.md)."""

    model: PretrainedLMConfig = field(default_factory=PretrainedLMConfig)
    """The base model (an id the host ships, or a local directory), dtype, device and LoRA adapters."""
    play: TextPlayConfig = field(default_factory=TextPlayConfig)
    """Prompt format, response budget, temperature and what an invalid response costs."""
    ppo: TextPPOConfig = field(default_factory=TextPPOConfig)
    """Turn-level PPO: the baseline (value head or per-seat running means), KL to the base, micro-batches."""
    mmd: TextMMDConfig = field(default_factory=TextMMDConfig)
    """Magnetic mirror descent on the game tree (learner 'text_mmd'): magnet, step size, distillation steps."""
    exit: TextExItConfig = field(default_factory=TextExItConfig)
    """Expert iteration with MCTS as the expert (learner 'text_exit'): search, buffer, Adam steps."""
    smmd: TextSMMDConfig = field(default_factory=TextSMMDConfig)
    """Sampled MMD from play (learner 'text_smmd', the default for any text game): magnet, step size, critic, RAE."""


@dataclass(frozen=True)
class CriticConfig:
    """The critic of learners 'mappo' (centralised: the side's global view) and 'ippo' (the same
    learner with a local critic: the ablation of Yu et al. 2022); agents/rl/mappo.py. The actor is
    `net`; PPO's clipping, entropy, epochs, minibatches, gamma and lambda come from `ppo`."""

    hidden: tuple[int, ...] = field(default=(64, 64), metadata=bounds(1, 65536))
    """Hidden widths of the critic MLP (ReLU, LayerNorm after each, as the authors' MLPBase)."""
    learning_rate: float = field(default=7e-4, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the critic (its own optimizer: actor and critic are separate nets)."""
    value_norm: bool = True
    """The critic predicts returns normalised by running mean/std statistics (ValueNorm)."""
    huber_delta: float | None = field(default=10.0, metadata=bounds(0, None, low_open=True))
    """Huber value loss with this threshold (normalised units); None: squared error."""
    agent_id: bool = True
    """Append the seat's one-hot id to the critic's input (whose return it predicts)."""
    own_observation: bool = False
    """'mappo': the seat's own observation before the side's global view (the agent-specific
    global state of Yu et al. 2022); 'ippo' reads only the own observation anyway."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if not self.hidden or min(self.hidden) < 1 or not self.learning_rate > 0:
            raise ConfigError("config keys 'critic.hidden' (positive widths) and 'critic.learning_rate' (> 0) are required")
        if self.huber_delta is not None and not self.huber_delta > 0:
            raise ConfigError(f"config key 'critic.huber_delta' must be > 0 or null, got {self.huber_delta}")


TEXT_LM_LEARNERS = text_lm_learners()
"""The built-in learners of pretrained LMs, each with the `text_lm` block of its settings (derived from
the table of learner kinds, league/learners/kinds.py; `text_lm_learners()` includes registered kinds)."""


@dataclass(frozen=True)
class GameWeight:
    """One game of a run that plays several (`games`), and its share of the matches."""

    game: str = ""
    """Game id (see `ludus games`)."""
    weight: float = field(default=1.0, metadata=bounds(0, 1e6, low_open=True))
    """Its matches' share is weight / the sum of the weights."""


DEFAULT_GAME = "tic_tac_toe"


@dataclass(frozen=True)
class LeagueConfig:
    """Everything `ludus train` needs. Keys are documented by the string under each field."""

    game: str = DEFAULT_GAME
    """Game id (see `ludus games`). With `games`, it is written for you: the mix of those games
    (``mix:A|B@2``, games/mix.py)."""
    games: tuple[GameWeight, ...] = ()
    """Several games for one run, with weights (SPIRAL trains one LM on three): each match plays one,
    drawn from its seed by weight; matchmaking, payoffs and TrueSkill are kept per game as well as
    combined, and the ledger records each match under its own game's id. Every learner kind plays
    the mix (nets read the game's index in the observation; an LM reads each game's own prompt).
    Entries are ``{game: ID, weight: W}`` or a bare id (weight 1), e.g. ``--set "games=[ta:TicTacToe-v0,
    {game: ta:KuhnPoker-v0, weight: 2}]"`` (which replaces a preset's `game`). Empty: the run plays `game`."""
    game_module: str = ""
    """Python module whose import registers `game` with `ludus.games.registry.register` (e.g.
    my_package.games); imported before the game is built, here and by every `ludus` command given
    this run (or one of its snapshots). Empty for built-in and installed (entry-point) games; a run
    created in Python records the module of its game's factory here by itself."""
    seed: int = field(default=0, metadata=bounds(0, 2**63, high_open=True))
    """Root seed: match seeds, initial weights and sampling all derive from it."""
    iterations: int = field(default=20, metadata=bounds(1, 10**9))
    """Number of league iterations (play -> learn -> rate -> snapshot) to run."""
    matches_per_iteration: int = field(default=256, metadata=bounds(1, 10**7))
    """Training matches played per iteration, over all learners."""
    num_envs: int = field(default=128, metadata=bounds(1, 10**6))
    """Games each runner steps at once (policy inference is batched across them)."""
    num_runners: int = field(default=1, metadata=bounds(1, 1024))
    """Runner shards. 'serial' plays them one after another in this process; 'process' in
    parallel worker processes; results are identical in sync mode."""
    backend: Literal["serial", "process", "ray"] = "serial"
    """Where runners run: 'serial' (one process), 'process' (multiprocessing), 'ray'."""
    ray_address: str | None = None
    """Ray cluster address for backend 'ray'; None starts a local Ray."""
    pipeline_depth: int = field(default=1, metadata=bounds(1, 2))
    """1 = sync (play with the latest weights); 2 = async (runners play iteration k+1 while the
    learner updates on iteration k, so data lags the learner by up to one version)."""
    max_policy_lag: int = field(default=1, metadata=bounds(0, 10**6))
    """Trajectories from a policy more than this many versions old are dropped (and counted)."""
    rating_share: float = field(default=0.1, metadata=bounds(0, 1, high_open=True))
    """Share of games that are rating matches between frozen members and anchors."""
    snapshot_every_steps: int = field(default=20_000, metadata=bounds(1, 10**12))
    """Freeze each learner into a snapshot after this many of its own decisions (env steps)."""
    snapshot_win_rate_lcb: float = field(default=0.7, metadata=bounds(0, 1))
    """Also freeze early when the Wilson 95% lower bound of the learner's win rate against the
    pool passes this (0 disables)."""
    payoff_decay: float = field(default=0.99, metadata=bounds(0, 1, low_open=True))
    """Decay of a pair's payoff counts before each of its games (older results matter less)."""
    draw_probability: float = field(default=0.1, metadata=bounds(0, 1, high_open=True))
    """TrueSkill draw probability for this game."""
    anchors: tuple[str, ...] = ("random",)
    """Fixed anchor players: bots (random, mcts-K, perfect; `bot:NAME` spells the same) or snapshot paths."""
    seed_population: tuple[str, ...] = ()
    """Extra frozen members at start: snapshot directories or other run directories."""
    torch_threads: int = field(default=1, metadata=bounds(1, 1024))
    """Torch threads of the manager process (learner updates). One is fastest on a small machine
    shared with runner processes."""
    runner_threads: int = field(default=1, metadata=bounds(1, 1024))
    """Torch threads of each runner (the serial runner too): one for board-game nets, whose small
    matrices gain nothing from more; two for pretrained LMs, whose generation is large matrix products."""
    inference_dtype: Literal["float32", "bfloat16"] = "float32"
    """What the runners' actor-critic nets act in: 'float32', or 'bfloat16' (a bf16 copy of each net,
    the frozen ones stacked: connect-four self-play 1.5x faster than float32 on a CPU with AMX
    tiles, benchmarks/inference_paths.py; GPUs gain too). Learners train in float32 either way;
    PPO's ratio divides by the log-probs of the bf16 policy that played."""
    policy_cache_size: int = field(default=64, metadata=bounds(1, 10**6))
    """Frozen snapshots kept loaded (LRU); the rest stay on disk."""
    max_opponents_per_iteration: int = field(default=32, metadata=bounds(1, 10**6))
    """Distinct opponents a learner may face per iteration (bounds inference batches)."""
    learner: str = "ppo"
    """Learning algorithm: 'ppo' (actor-critic nets), 'mappo' (a side's shared actor with a centralised
    critic: team and cooperative games), 'ippo' (the same with a local critic), 'token_ppo' (tiny LMs on
    token games), 'text_ppo' (pretrained LMs through a game's text view), 'text_mmd' (the same LMs trained
    by magnetic mirror descent on a small OpenSpiel game's exact tree), 'text_exit' (the same LMs trained
    by expert iteration, MCTS over the rules as the expert: tic-tac-toe), 'text_smmd' (the same LMs on any
    text game from play alone: sampled MMD with a learned critic; the default LM learner) or 'sdcfr'
    (Single Deep CFR on two-player OpenSpiel games: a regret-matching net trained on the game tree's
    sampled regrets). Each is a
row of the table in league/learners/kinds.py (`register_learner_kind` adds one)."""
    learner_backend: LearnerBackendConfig = field(default_factory=LearnerBackendConfig)
    """Optimizer backend of the learners."""
    net: NetConfig = field(default_factory=NetConfig)
    """Actor-critic architecture of the learners."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyperparameters of the learners."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The separate critic of learners 'mappo' and 'ippo'."""
    cfr: DeepCFRConfig = field(default_factory=DeepCFRConfig)
    """Single Deep CFR's traversals, memory and training (learner 'sdcfr')."""
    dialogue: DialogueConfig = field(default_factory=DialogueConfig)
    """Language-model learners for token games (learner 'token_ppo'): model, token PPO, imitation warm start."""
    text_lm: TextLMConfig = field(default_factory=TextLMConfig)
    """Pretrained LM learners ('text_ppo', 'text_mmd', 'text_exit'): base model, adapters, prompts, PPO,
    MMD or expert iteration."""
    roles: tuple[RoleConfig, ...] = (RoleConfig(),)
    """Learning roles; each is one learner."""
    output_policy: Literal["newest", "average", "uniform_average"] = "newest"
    """What the league outputs when no role is PSRO (a PSRO role's meta-strategy always is):
    'newest', the main role's newest snapshot (AlphaStar ships its main agents); 'average', the
    mixture of all the main role's snapshots, the k-th weighted k (linear averaging, as CFR+
    averages its iterates), played as one behaviour policy: in two-player zero-sum games where
    the self-play iterates keep cycling around an equilibrium, their average approaches it (the
    average strategy of fictitious self-play, Heinrich et al. 2015); 'uniform_average', the same
    mixture with equal weights (Single Deep CFR's average strategy, learner 'sdcfr')."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging."""

    @property
    def main_role(self) -> RoleConfig:
        """The first role of kind 'main' (the first role if none is): the one the output policy
        and the league's headline figures follow."""
        return next((role for role in self.roles if role.kind == "main"), self.roles[0])

    def role_net(self, index: int) -> NetConfig:
        """The actor-critic architecture of role `index`'s learner: its own `net` or the league's."""
        return self.roles[index].net or self.net

    @property
    def psro_role(self) -> RoleConfig | None:
        """The first role with `meta_nash` weight (PSRO: its meta-solver makes the output policy), or None."""
        return next((role for role in self.roles if role.meta_nash > 0), None)

    def __post_init__(self) -> None:
        if self.games:
            from ludus.games.core import GameError
            from ludus.games.mix import MixPart, format_mix

            try:
                mix = format_mix([MixPart(g.game, g.weight) for g in self.games])
            except GameError as exc:
                raise ConfigError(f"config key 'games': {exc}") from None
            if self.game not in (DEFAULT_GAME, mix):
                raise ConfigError(f"config keys 'game' ({self.game}) and 'games' both name the run's game: set "
                                  f"one ('games' writes game = {mix})")
            object.__setattr__(self, "game", mix)
        positive = ("iterations", "matches_per_iteration", "num_envs", "num_runners",
                    "snapshot_every_steps", "torch_threads", "runner_threads", "policy_cache_size", "max_opponents_per_iteration")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"config key {key!r} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"config key 'seed' must be in [0, 2**63), got {self.seed}")
        if self.pipeline_depth not in (1, 2):
            raise ConfigError(f"config key 'pipeline_depth' must be 1 (sync) or 2 (async), got {self.pipeline_depth}")
        if self.max_policy_lag < 0:
            raise ConfigError("config key 'max_policy_lag' must be >= 0")
        if not 0.0 <= self.rating_share < 1.0:
            raise ConfigError(f"config key 'rating_share' must be in [0, 1), got {self.rating_share}")
        if not 0.0 <= self.snapshot_win_rate_lcb <= 1.0:
            raise ConfigError("config key 'snapshot_win_rate_lcb' must be in [0, 1]")
        if not 0.0 < self.payoff_decay <= 1.0:
            raise ConfigError("config key 'payoff_decay' must be in (0, 1]")
        if not 0.0 <= self.draw_probability < 1.0:
            raise ConfigError("config key 'draw_probability' must be in [0, 1)")
        kind = learner_kind(self.learner)  # one line, with the closest name, for an unknown kind
        head_owners = {k.net_head[0]: k for k in learner_kinds() if k.net_head}
        for key, net in (("net", self.net), *((f"roles.{r.name}.net", r.net) for r in self.roles if r.net)):
            if net.layer_norm and net.kind != "mlp":
                raise ConfigError(f"config key '{key}.layer_norm' is for net.kind 'mlp', not {net.kind!r}")
            owner = kind if kind.net_head else head_owners.get(net.head)
            if owner is not None and owner.net_head and (owner is kind) != (net.head == owner.net_head[0]):
                raise ConfigError(f"learner {owner.name!r} and {key}.head {owner.net_head[0]!r} go together "
                                  f"({owner.net_head[1]}); set both or neither")
        own_net = [r.name for r in self.roles if r.net is not None]
        if own_net and not kind.uses_net:
            raise ConfigError(f"roles.{own_net[0]}.net: learner {self.learner!r} has no actor-critic net; a role's "
                              f"own net is for learners {spoken([k.name for k in learner_kinds() if k.uses_net])}")
        if not self.roles:
            raise ConfigError("config key 'roles' needs at least one role")
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ConfigError(f"config key 'roles': role names must be unique, got {names}")
        if self.learner_backend.backend == "deepspeed":
            if not kind.deepspeed:
                # never silently replaced by torch Adam: say so before anything runs
                raise ConfigError(f"learner_backend.backend 'deepspeed' trains learners "
                                  f"{spoken([k.name for k in learner_kinds() if k.deepspeed])}, not "
                                  f"{self.learner!r}; set learner_backend.backend=torch")
            if self.learner_backend.ranks > 1 and not kind.data_parallel:
                ranked = [k.name for k in learner_kinds() if k.data_parallel]
                raise ConfigError(f"learner_backend.ranks > 1 trains learner{'s' * (len(ranked) > 1)} {spoken(ranked)} "
                                  f"on data-parallel ranks, not {self.learner!r}; set learner_backend.ranks=1")
        kind.validate(self)  # the kind's own checks (league/learners/kinds.py)
        # One spelling of bots everywhere: `bot:random` is the anchor `random` (member anchor:random).
        from ludus.agents.bots.builtin import BOT_PREFIX

        object.__setattr__(self, "anchors", tuple(a.removeprefix(BOT_PREFIX) for a in self.anchors))
        if "base" in self.anchors and not kind.text_lm:
            raise ConfigError(f"anchor 'base' (the untrained base LM) needs an LM learner: "
                              f"{', '.join(text_lm_learners())}")
        if self.backend != "ray" and self.ray_address is not None:
            raise ConfigError("config key 'ray_address' needs backend 'ray'")
        if self.output_policy != "newest" and self.psro_role is not None:
            raise ConfigError(f"config key 'output_policy' {self.output_policy!r}: a PSRO role's meta-strategy is the "
                              f"output of this league; drop output_policy or the role's meta_nash")


# Config by sections (issue 75): `ludus config show` prints the common keys and the blocks this
# config's learner kind (league/learners/kinds.py), optimizer backend and game read.
def _learner_sections(config: LeagueConfig) -> tuple[str, ...]:
    """The blocks the config's learner kind reads (dotted prefixes of the config tree): a text-LM
    kind reads the model, the play settings and its own block of `text_lm`."""
    kind = learner_kind(config.learner)
    if kind.text_lm:
        return ("text_lm.model", "text_lm.play", f"text_lm.{kind.text_lm}")
    return tuple(block for block in kind.settings if block != "learner_backend")


def sections_for(config: LeagueConfig) -> set[str]:
    """The blocks of the config tree that `config` reads beyond the common keys, as dotted prefixes
    ('ppo', 'text_lm.play', 'learner_backend.backend'), decided from `config.learner`,
    `config.learner_backend.backend` and the game."""
    sections = {"roles", "log", *_learner_sections(config)}
    if config.learner_backend.backend != "torch":
        sections.add("learner_backend")  # DeepSpeed's ZeRO stage, precision, ranks
    elif learner_kind(config.learner).deepspeed:
        sections.add("learner_backend.backend")
    return sections


def _is_team_game(game: str) -> bool:
    from ludus.games.registry import spec

    try:
        return bool(spec(game).teams)
    except Exception:  # an unknown game is config_from_dict's error, not this view's
        return False


def _inert_keys(config: LeagueConfig) -> set[str]:
    """Keys of the shown blocks that cannot take effect in `config` (`ludus config show` leaves
    them out unless they are set): the Ray address off Ray, the policy-lag limit in sync mode, a
    net's convolution channels on an MLP, its head outside Single Deep CFR (it must be 'softmax'),
    the second learning-rate schedule while `anneal_lr` is on, and per role: its name (the key
    holds it), its share of the matches when it is the only role, the PSRO weights outside OpenSpiel games (the exact meta-game needs one), the side
    outside team games, the plateau's gain without the plateau trigger."""
    inert = {"ray_address"} if config.backend != "ray" else set()
    if config.pipeline_depth == 1:
        inert.add("max_policy_lag")  # sync: every trajectory comes from the newest weights
    if config.ppo.anneal_lr:
        inert.add("ppo.lr_decay_updates")
    nets = [("net", config.net), *((f"roles.{r.name}.net", r.net) for r in config.roles if r.net)]
    for prefix, net in nets:
        if net.kind != "conv":
            inert.add(f"{prefix}.channels")
        if not learner_kind(config.learner).net_head:
            inert.add(f"{prefix}.head")
    if len(config.roles) == 1:
        inert.add(f"roles.{config.roles[0].name}.learner_share")  # shares are normalised: one role plays every match
    team_game = _is_team_game(config.game)
    for role in config.roles:
        prefix = f"roles.{role.name}."
        inert.add(prefix + "name")
        if not registry.reaches_game_tree(config.game) and role.meta_nash == 0:
            inert |= {prefix + "meta_nash", prefix + "meta_solver", prefix + "prd_exploration"}
        elif role.meta_nash == 0:
            inert |= {prefix + "meta_solver", prefix + "prd_exploration"}
        if not team_game and role.team is None:
            inert.add(prefix + "team")
        if role.snapshot_on_plateau == 0:
            inert.add(prefix + "plateau_min_gain")
        if role.pfsp_weighting != "hard":
            inert.add(prefix + "pfsp_power")
    return inert


def _default_value(key: str) -> Any:
    """The default of a dotted key (a role's keys: RoleConfig's; a role's own net: NetConfig's)."""
    parts = key.split(".")
    if parts[0] == "roles" and len(parts) > 2:
        node: Any = RoleConfig()
        parts = parts[2:]
        if parts[0] == "net" and len(parts) > 1:
            node, parts = NetConfig(), parts[1:]
    else:
        node = LeagueConfig()
    for part in parts:
        node = getattr(node, part)
    return to_dict(node) if isinstance(node, tuple) else node


def changed_keys(config: LeagueConfig) -> set[str]:
    """The dotted keys of `config` whose value differs from the default (`ludus config show --diff`)."""
    from ludus.league.configio import describe

    changed = set()
    for key, value, _ in describe(LeagueConfig, config):
        if value == "" or key == "roles":
            continue  # a section's heading; the roles list: each role's keys say it
        try:
            default = _default_value(key)
        except AttributeError:
            default = None
        if value != default:
            changed.add(key)
    return changed


def shown_keys(config: LeagueConfig) -> set[str]:
    """The keys `ludus config show` prints: the common ones (the top level's own values), the
    blocks `sections_for` names, less those that cannot take effect, plus every key set away from
    its default (nothing set is hidden)."""
    from ludus.league.configio import describe

    sections, inert = sections_for(config), _inert_keys(config)
    keys = set()
    for key, value, _ in describe(LeagueConfig, config):
        if value == "" or key == "roles":
            continue
        top_level = "." not in key
        in_section = any(key == s or key.startswith(s + ".") for s in sections)
        if (top_level or in_section) and key not in inert:
            keys.add(key)
    names = {f"roles.{role.name}.name" for role in config.roles}  # the key holds it
    return keys | (changed_keys(config) - names)


def config_yaml(config: LeagueConfig, everything: bool = False) -> str:
    """A runnable YAML file of `config` (`ludus train` on it builds the same config): the keys set
    away from the defaults, or with `everything` every key."""
    from ludus.league.configio import dump_yaml

    data = to_dict(config)
    if not everything:
        data = {"game": config.game, **_diff_data(data, to_dict(LeagueConfig()))}
        if "roles" in data:  # each role in full is long: its name and the keys it changes (a role's net whole)
            default_role = to_dict(RoleConfig())
            data["roles"] = [{"name": role["name"], **{k: v for k, v in role.items() if v != default_role[k]}}
                             for role in data["roles"]]
    return dump_yaml(data)


def _diff_data(data: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The entries of nested `data` that differ from `default` (mappings compared key by key)."""
    diff = {}
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(default.get(key), dict):
            inner = _diff_data(value, default[key])
            if inner:
                diff[key] = inner
        elif value != default.get(key):
            diff[key] = value
    return diff


PRESETS_DIR = Path(__file__).resolve().parent / "presets"
"""The presets, one YAML file each (league/presets/NAME.yaml): overrides of the defaults, validated
like any YAML file. Each opens with what it trains, the figure it reached and the doc to read;
docs/results.md keeps the experiment history behind them."""

PRESET_KEY = "preset"
"""The top-level key of a YAML file that starts from a preset: `preset: tic_tac_toe`."""


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def preset_summary(name: str) -> str:
    """The first line of a preset file's opening comment: what it trains."""
    for line in (PRESETS_DIR / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def preset_data(name: str) -> dict[str, Any]:
    """The keys preset `name` sets (its YAML file, parsed); an unknown name is a one-line error."""
    if name not in preset_names():
        import difflib

        close = difflib.get_close_matches(str(name), preset_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; presets: {', '.join(preset_names())}")
    return load_yaml(PRESETS_DIR / f"{name}.yaml")


def merge_config_data(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` on top, as `--set` applies them: mappings merge key by key, any other
    value (a number, a list such as `anchors` or `roles`) replaces the base's whole."""
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config_data(merged[key], value)
        else:
            merged[key] = value
    return merged


def _from_preset(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A file's keys on top of the preset its `preset:` key names (a preset file may name one too)."""
    seen = [source]
    while PRESET_KEY in data:
        name = data[PRESET_KEY]
        if not isinstance(name, str):
            raise ConfigError(f"config key {PRESET_KEY!r} in {source!r}: expected a preset name, got {name!r}")
        if name in seen:
            raise ConfigError(f"config key {PRESET_KEY!r}: presets {' -> '.join(seen + [name])} start from each other")
        seen.append(name)
        base = preset_data(name)
        if "games" in data and "game" not in data:
            base = {k: v for k, v in base.items() if k != "game"}  # the file's games replace the preset's game
        data = merge_config_data(base, {k: v for k, v in data.items() if k != PRESET_KEY})
    return data


def load_config(source: str | None, overrides: list[str] | None = None) -> LeagueConfig:
    """A preset name or a YAML file path (which may start from a preset: `preset: NAME`), or None
    for the defaults, plus `key=value` overrides, validated."""
    if source is None:
        data: dict[str, Any] = {}
    elif source in preset_names():
        data = preset_data(source)
    elif source.endswith((".yaml", ".yml")) or Path(source).exists():
        data = load_yaml(source)
    else:
        import difflib

        close = difflib.get_close_matches(source, preset_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{source!r} is neither a preset nor a YAML file{hint}; presets: "
                          f"{', '.join(preset_names())}")
    data = _from_preset(data, source or "--set")
    overrides = overrides or []
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    if "games" in keys and "game" not in keys:
        data = {k: v for k, v in data.items() if k != "game"}  # `--set games=[...]` replaces the preset's game
    if "roles" not in data and any(item.startswith("roles.") for item in overrides):
        # `--set roles.main.pfsp=...` on a config that keeps the default role: name it explicitly.
        data = {**data, "roles": [to_dict(role) for role in LeagueConfig.__dataclass_fields__["roles"].default]}
    return config_from_dict(apply_overrides(data, overrides))


def import_game_module(module: str, game: str) -> None:
    """Import the module that registers `game` (config key `game_module`); a one-line ConfigError
    if it cannot be imported."""
    import importlib

    if not module:
        return
    if module == "__main__":  # registered by a script: known in that script's process only
        from ludus.games.registry import native_names

        if game.split("(", 1)[0] in native_names():
            return
        raise ConfigError(f"game {game!r} was registered by a script (__main__) when the run was made, and "
                          f"`ludus` cannot import a script: move the register call into an importable module and "
                          f"set game_module to it in the run's config.json, or install the game under the "
                          f"'ludus.games' entry-point group (docs/games.md)")
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"config key 'game_module': cannot import {module!r}, which registers game {game!r} "
                          f"({exc}); put it on PYTHONPATH or install its package") from None


def registering_module(game: str) -> str:
    """The module to record as `game_module` for a game registered at run time with
    `ludus.games.registry.register`: the module that called it ('__main__' for a script, which
    `import_game_module` then refuses in any other process); '' for built-in and entry-point games."""
    from ludus.games.registry import REGISTERED_BY, native_entry

    try:
        entry = native_entry(game)
    except Exception:  # an adapter or unknown id: config_from_dict names the problem
        return ""
    return "" if entry is None else REGISTERED_BY.get(entry.name, "")


def config_from_dict(data: dict[str, Any]) -> LeagueConfig:
    config = from_dict(LeagueConfig, _with_role_nets(_with_game_weights(data)))
    from ludus.games.core import GameError
    from ludus.games.registry import spec

    import_game_module(config.game_module, config.game)
    try:
        spec(config.game)  # an unknown game id fails here, before anything runs
    except GameError as exc:
        raise ConfigError(f"config key 'game': {exc}") from None
    return config


def _with_game_weights(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each entry of `games` that is a bare game id written as ``{game: ID}`` (weight 1)."""
    games = data.get("games")
    if not isinstance(games, list):
        return data  # absent, or not a list: from_dict names the problem
    return {**data, "games": [{"game": g} if isinstance(g, str) else g for g in games]}


def _with_role_nets(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each role's `net` completed by the league's: a role names only the keys it changes."""
    roles, league_net = data.get("roles"), data.get("net", {})
    if not isinstance(roles, list) or not isinstance(league_net, dict):
        return data  # not lists/mappings: from_dict names the problem
    completed = [{**role, "net": {**league_net, **role["net"]}}
                 if isinstance(role, dict) and isinstance(role.get("net"), dict) else role for role in roles]
    return {**data, "roles": completed}


def config_to_dict(config: LeagueConfig) -> dict[str, Any]:
    return to_dict(config)


def with_overrides(config: LeagueConfig, **changes: Any) -> LeagueConfig:
    return replace(config, **changes)
