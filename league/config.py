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
from ludus.agents.lm.text_ppo import TextPPOConfig
from ludus.agents.rl.token_ppo import TokenPPOConfig
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

    wandb: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode; 'offline' writes under the run directory and needs no key."""
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
class LeagueConfig:
    """Everything `ludus train` needs. Keys are documented by the string under each field."""

    game: str = "tic_tac_toe"
    """Game id (see `ludus games`)."""
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
    by expert iteration, MCTS over the rules as the expert: tic-tac-toe) or 'sdcfr' (Single Deep CFR on
    two-player OpenSpiel games: a regret-matching net trained on the game tree's sampled regrets). Each is a
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


# Presets: overrides of the defaults, validated like any YAML file.
_POKER_PSRO: dict[str, Any] = {
    "matches_per_iteration": 512, "num_envs": 512,
    "snapshot_every_steps": 15_000, "snapshot_win_rate_lcb": 0.0, "rating_share": 0.02,
    "anchors": ["random"], "max_opponents_per_iteration": 1000, "draw_probability": 0.0,
    "net": {"kind": "mlp", "hidden": [128, 128], "activation": "relu"},
    "ppo": {"learning_rate": 1e-2, "anneal_lr": False, "gamma": 1.0, "gae_lambda": 0.5,
            "num_minibatches": 4, "update_epochs": 4, "ent_coef": 0.05},
    "roles": [{"name": "main", "kind": "main", "self_play": 0.0, "pfsp": 0.0, "uniform": 0.0,
               "meta_nash": 1.0, "reset_every_snapshots": 1}],
}
"""The PSRO recipe of `kuhn_poker` (comments there); `leduc_poker` keeps its game settings, net and PPO
but its own roles and output policy."""

PRESETS: dict[str, dict[str, Any]] = {
    # Team vs team: predators (team 0, three seats sharing one actor) against the prey (team 1).
    # One population per side; TrueSkill rates the sides' snapshots as teams (games/builtin/tag.py has
    # the winner rule). MAPPO (league/learners/mappo.py): each side's critic reads the seat's own
    # observation, then the game's global state (Yu et al. 2022's agent-specific state): after 150
    # iterations its predators caught more in cross-play than with the global state alone on
    # four of five seeds (measured before the prey's changes below), though not reliably more
    # than IPPO's (docs/league.md).
    # The prey's learner plays 6 of every 7 training matches (the predators' three seats give
    # three rows a step, so the prey learns from twice the predators' rows) and draws its
    # opponents uniformly from the predators' snapshots (fictitious play, Heinrich et al. 2015):
    # under PFSP, which weights the predators it loses to (mostly the newest), its later
    # snapshots lost more often to the early predators than the untrained prey did. The
    # predators win the arms race: with equal rows the prey's later snapshots scored 0.04-0.14
    # against the later predators and its ratings stopped rising on some seeds. 40% rating
    # matches: a side's snapshots differ by little, and at 20% their ratings' sigma (0.6-1.2) was
    # as large as the spread of their mu. 300 iterations of 256 matches (9.6M steps, ~5 minutes
    # with two runs at a time on games/builtin/tag.py's batched world): the prey's ratings rise too slowly
    # for half of that on some seeds (seed 2's prey: Spearman 0.792 after 150, 0.926 after 300;
    # docs/league.md has the figures). The prey's actor
    # is twice as wide as the predators' ([128, 128] against [64, 64]): with the predators' width
    # its later snapshots stopped getting stronger on some seeds (prey Spearman 0.756 on seed 4,
    # 0.944 with the wider net; seed 1 0.841 -> 0.903).
    "simple_tag": {
        "game": "simple_tag", "learner": "mappo", "iterations": 300, "matches_per_iteration": 256, "num_envs": 128,
        "snapshot_every_steps": 12000, "anchors": ["random"], "rating_share": 0.4, "draw_probability": 0.05,
        "net": {"hidden": [64, 64], "activation": "relu"}, "critic": {"own_observation": True},
        "ppo": {"learning_rate": 7e-4, "anneal_lr": False, "adam_eps": 1e-5, "gamma": 0.99, "num_minibatches": 4,
                "update_epochs": 4, "max_grad_norm": 10.0},
        "roles": [
            {"name": "predators", "kind": "main", "team": 0, "self_play": 0.0, "pfsp": 0.7, "uniform": 0.3},
            {"name": "prey", "kind": "main", "team": 1, "self_play": 0.0, "pfsp": 0.0, "uniform": 1.0,
             "learner_share": 6.0, "net": {"hidden": [128, 128]}},
        ],
    },
    # 2v2 tic-tac-toe (games/builtin/teams.py): partners alternate at their side's moves without conferring.
    # Team ratings beyond MPE: each side is a team of two seats of one snapshot, rated as a team;
    # MAPPO's critic reads both partners' observations (the game has no separate global state).
    "tic_tac_toe_2v2": {
        "game": "teams(game=tic_tac_toe)", "learner": "mappo", "iterations": 40, "matches_per_iteration": 256,
        "num_envs": 128, "snapshot_every_steps": 4000, "snapshot_win_rate_lcb": 0.0, "anchors": ["random"],
        "rating_share": 0.25, "draw_probability": 0.3,
        "net": {"kind": "mlp", "hidden": [128, 128], "activation": "relu"},
        "ppo": {"learning_rate": 7e-4, "anneal_lr": False, "adam_eps": 1e-5, "num_minibatches": 4, "update_epochs": 4,
                "ent_coef": 0.01, "max_grad_norm": 10.0},
        "roles": [{"name": "main", "kind": "main", "self_play": 0.3, "pfsp": 0.5, "uniform": 0.2}],
    },
    # Cooperative navigation: one team, no opponents, so nothing to rate. MAPPO (Yu et al. 2022):
    # one actor shared by the three agents, a centralised critic on the env's global state; the
    # settings of benchmarks/mappo_spread.py's stand-alone trainer (the paper's MPE defaults with
    # gamma 0.95 and 128 games per update in 2 minibatches, tuned there for a ~400k-step budget).
    # The actor has LayerNorm on its input and hidden layers, as the authors' MLPBase: without it
    # (the plain MLP) 180 iterations closed 0.56 and 0.61 of the random-to-scripted gap (seeds 0-1),
    # with it 0.70 / 0.64 / 0.66 (seeds 0, 1 and the untuned 4), each in ~6 minutes.
    "simple_spread": {
        "game": "pz:mpe2.simple_spread_v3", "learner": "mappo", "iterations": 180, "matches_per_iteration": 128,
        "num_envs": 128, "snapshot_every_steps": 100_000, "anchors": [], "rating_share": 0.0,
        "net": {"hidden": [64, 64], "activation": "relu", "layer_norm": True},
        "ppo": {"learning_rate": 7e-4, "anneal_lr": False, "adam_eps": 1e-5, "gamma": 0.95, "gae_lambda": 0.95,
                "num_minibatches": 2, "update_epochs": 10, "ent_coef": 0.01, "max_grad_norm": 10.0},
        "roles": [{"name": "main", "kind": "main", "self_play": 1.0, "pfsp": 0.0, "uniform": 0.0}],
    },
    "quickstart": {
        "game": "tic_tac_toe", "iterations": 6, "matches_per_iteration": 128, "num_envs": 64,
        "snapshot_every_steps": 800, "anchors": ["random", "perfect"],
        "log": {"wandb": "disabled", "tensorboard": False},
    },
    # Tic-tac-toe to perfect play (benchmarks/ttt_skill.py: 0 lost lines against the perfect
    # player, every optimal reply enumerated). PPO learns a best response to its opponent mix, so
    # the mix leans on the perfect anchor: PFSP with a steep (1-x)^3 picks the opponents the
    # learner cannot beat (perfect, and its own near-perfect snapshots); the random anchor stays
    # as the rating floor. 8 epochs x 8 minibatches (64 Adam steps per iteration, 4x the old
    # 4x4) and a 256x256 ReLU net made the difference: the old tanh 128x128 with 16 steps per
    # iteration plateaued at ~20 lost lines after 650k env steps.
    "tic_tac_toe": {
        "game": "tic_tac_toe", "iterations": 100, "matches_per_iteration": 512, "num_envs": 256,
        "snapshot_every_steps": 20_000, "anchors": ["random", "perfect"],
        "net": {"kind": "mlp", "hidden": [256, 256], "activation": "relu"},
        "ppo": {"learning_rate": 1e-3, "num_minibatches": 8, "update_epochs": 8, "ent_coef": 0.01},
        "roles": [{"name": "main", "kind": "main", "self_play": 0.2, "pfsp": 0.8, "uniform": 0.0,
                   "pfsp_power": 3.0}],
    },
    # Connect four in ~15 minutes on 2 cores (benchmarks/connect_four_skill.py: 1100 iterations
    # in 830-857 s, or 1094 of them in the 15 minutes, then 0.739 / 0.718 / 0.729 against
    # MCTS-100 with no search on seeds 3 / 5 / 6; 1000 iterations, the preset's length until the
    # nets acted fused and ~40 s sooner: 767-802 s, 983 s on a busier host, then 0.636 / 0.744 /
    # 0.761 on seeds 3 / 5 / 4; 600 iterations, its length before the anchors' search was
    # compiled: 0.601 / 0.679 on seeds 3 / 4).
    # Two runner processes play while the learners update in the manager (async, data one version
    # old): the MCTS anchors' games are search on the runners (compiled for connect four,
    # agents/bots/connect_four_mcts.py), and with one runner the second core idled. A shared-trunk MLP:
    # 4x cheaper to train than conv nets of equal skill per sample here. PPO: many small
    # minibatches and a high learning rate (gradient steps, not samples, limited learning);
    # lambda 0.8 leans on the critic, which learns threats before the policy does; unclipped
    # value loss (Andrychowicz et al. 2021). Snapshots on a fixed step cadence only: the win-rate
    # trigger fired every iteration (the pool holds random and weak early snapshots), which
    # turned the league into plain self-play against copies of the last few iterations.
    # MCTS anchors (fixed opponents, as AlphaStar's league kept its supervised agents): mcts-25
    # punishes every one-move blunder, which self-play opponents miss; mcts-100 punishes two-move
    # tactics. PFSP sends the main agent to whichever it still loses to. Measured in 15 minutes:
    # with anchors random + mcts-25 only, 0.35 against MCTS-100; with mcts-100 added, 0.74.
    # The nets act in bfloat16 (frozen snapshots stacked, ludus.agents.nets.StackedActors): self-play
    # ~1.9x faster than float32 on a CPU with AMX tiles (benchmarks/inference_paths.py). Acting
    # in bf16 moves a trained net's log-probs by 0.002 on average (PPO's clip is 0.2); 15-minute
    # runs scored 0.557-0.647 against MCTS-100 in bf16 and 0.599-0.734 in float32
    # (docs/scale_out.md). On a CPU without bf16 instructions set inference_dtype=float32.
    "connect_four": {
        "game": "connect_four", "iterations": 1100, "matches_per_iteration": 1024, "num_envs": 512,
        "backend": "process", "num_runners": 2, "pipeline_depth": 2, "inference_dtype": "bfloat16",
        "snapshot_every_steps": 250_000, "snapshot_win_rate_lcb": 0.0,
        "anchors": ["random", "mcts-25", "mcts-100"],
        "net": {"kind": "mlp", "hidden": [256, 256], "activation": "relu", "shared_trunk": True},
        "ppo": {"learning_rate": 1e-3, "update_epochs": 4, "minibatch_size": 512, "gae_lambda": 0.8,
                "clip_vloss": False},
        "roles": [
            {"name": "main", "kind": "main", "learner_share": 0.75},
            {"name": "main_exploiter", "kind": "main_exploiter", "learner_share": 0.125,
             "self_play": 0.0, "pfsp": 0.5, "uniform": 0.5, "pfsp_weighting": "var"},
            {"name": "league_exploiter", "kind": "league_exploiter", "learner_share": 0.125,
             "self_play": 0.0, "pfsp": 1.0, "uniform": 0.0, "reset_every_snapshots": 2},
        ],
    },
    # PSRO on Kuhn poker (Lanctot et al. 2017; league/psro.py, benchmarks/kuhn_skill.py): the main
    # learner trains only against opponents drawn from the Nash mixture of the population's exact
    # meta-game; each snapshot is one PSRO iteration's best response, after which the learner is
    # reset to its initial weights (a fresh best response from a near-uniform policy: one warm-
    # started from the last best response sits on near-deterministic actions and stops improving).
    # A PPO best response against a near-equilibrium mixture is hard: advantages are small, and
    # bluffing or slow-playing pays only together with the right later action. Measured choices:
    # relu 128x128 (the observation tensor must be split into "facing a bet" per seat, which a
    # small tanh net learns slowly); lr 1e-2 without annealing; entropy 0.05 (less gets stuck on
    # the honest, never-bluffing policy); gamma 1 (one reward at the end) with GAE lambda 0.5
    # (bootstrapping the second decision lowers variance); 512 matches per update and a snapshot
    # every 15k own decisions (~25 updates, enough to be within ~0.02-0.04 of a best response);
    # no early freezing; few rating matches (the exact meta-game drives matchmaking); an unbounded
    # opponent pool (the Nash mixture is over the whole population).
    "kuhn_poker": {**_POKER_PSRO, "game": "spiel:kuhn_poker", "iterations": 750},
    # Leduc poker (6 cards, two betting rounds, 936 information states; the OpenSpiel adapter's
    # default information-state tensor gives perfect recall): Single Deep CFR (league/learners/cfr.py,
    # agents/solvers/deep_cfr.py), not a policy gradient. One update is 5 CFR iterations, each 300
    # external-sampling traversals per seat and 200 minibatch steps of the regret net on a 400k
    # reservoir; a snapshot after every update is one iterate, and the output is their uniform
    # average. The few matches per iteration only rate the snapshots. Averaged PPO self-play, the
    # preset before, stalled at ~0.20 after 10 minutes (seeds 0-6: 0.181-0.224); this recipe,
    # 0.139-0.155 on seeds 0-5 in the same budget (docs/league.md). Every snapshot stays loaded
    # (rating matches draw from all of them). ~300 iterations are ~10 minutes here.
    "leduc_poker": {
        "game": "spiel:leduc_poker", "learner": "sdcfr", "iterations": 300, "matches_per_iteration": 64,
        "num_envs": 64, "snapshot_every_steps": 1, "snapshot_win_rate_lcb": 0.0, "rating_share": 0.25,
        "anchors": ["random"], "draw_probability": 0.0, "policy_cache_size": 1024,
        "output_policy": "uniform_average",
        "net": {"kind": "mlp", "hidden": [128, 128], "activation": "relu", "head": "regret_matching"},
        "cfr": {"iterations_per_update": 5, "traversals": 300, "train_steps": 200, "memory_size": 400_000,
                "linear_weighting": False},
        "roles": [{"name": "main", "kind": "main", "self_play": 1.0, "pfsp": 0.0, "uniform": 0.0}],
    },
    # Pretrained LMs (docs/llm.md): SmolLM2-135M-Instruct with rank-8 LoRA adapters plays through
    # the game's text view. A turn is a short answer opened with "[" (a 135M model rarely finds the
    # bracket format on its own) and closed at "]". The untrained base (anchor 'base') and the
    # random mover pin the rating scale. One runner in the manager's process: generation is the
    # cost, and it is batched over every seat the LM plays in the iteration's matches.
    # Kuhn poker has 12 information states, so the LM learns by magnetic mirror descent on the
    # exact tree (learner 'text_mmd', agents/lm/text_mmd.py): turn-level PPO on the sampled turns
    # settled on "bet and call with every card" (0.33 exploitable) in every variant tried
    # (docs/llm.md). One MMD iteration (eight distillation steps) per update, its 32 matches only
    # rate the snapshots: ~42 s per iteration (learn ~36, play ~5) with one thread each for two runs
    # side by side, 0.05-0.06 exploitable after 42 iterations (30 min).
    "llm_kuhn_poker": {
        "game": "spiel:kuhn_poker", "learner": "text_mmd", "iterations": 60, "matches_per_iteration": 32,
        "torch_threads": 2, "runner_threads": 2,
        "num_envs": 32, "snapshot_every_steps": 250, "snapshot_win_rate_lcb": 0.0, "rating_share": 0.1,
        "anchors": ["random", "base"], "draw_probability": 0.0,
        "roles": [{"name": "main", "kind": "main", "self_play": 0.5, "pfsp": 0.3, "uniform": 0.2}],
        "text_lm": {"play": {"max_new_tokens": 4, "temperature": 0.7}},  # text_lm.mmd: its defaults
    },
    "llm_tic_tac_toe": {
        "game": "tic_tac_toe", "learner": "text_exit", "iterations": 40, "matches_per_iteration": 20,
        "torch_threads": 2, "runner_threads": 2,
        "num_envs": 16, "snapshot_every_steps": 2000, "snapshot_win_rate_lcb": 0.0, "rating_share": 0.1,
        "anchors": ["random", "base"],
        # Expert iteration (agents/lm/text_exit.py): MCTS over the rules answers every position the LM
        # met, and the adapters learn its answers. Activated LoRA (docs/llm.md): the adapters (rank
        # 16 on every projection of all 30 layers) read only "assistant\n[" and the answer; the
        # board is read by the base once per run, so a step of 32 positions costs ~0.8-1.1 s on a
        # host with AVX-512, ~1.3-1.5 s without. An iteration plays 20 matches (~10-35 s) and takes
        # 48 steps. What is scarce is positions, not steps: the search's answers do not depend on
        # the opponent, only the positions met do, and the LM against itself, near-deterministic at
        # temperature 0.5, replays its games, while PFSP's hardest opponents are the base and its
        # zero-adapter snapshot. So no self-play and no PFSP: uniform over the random mover, the
        # base and the snapshots, every match has a stochastic opponent (DAgger's point: learn on
        # the positions met where the policy is measured). Seeds 5-7 (new; AVX-512 host):
        # 1,200-1,344 steps over 406-441 positions, 0.894, 0.862, 0.863 against the random mover;
        # the previous mix (0.3 self-play, 0.3 PFSP, 0.4 uniform, 16 matches) on seed 6 there: 1,392
        # steps over 350 positions, 0.834, and 0.816-0.846 on a host without AVX-512 (seeds 2, 4).
        # The preset on a slower host without AVX-512 (~2.4 s a step): 432 steps, 0.776 (seed 8);
        # on a faster AVX-512 host (~0.8 s a step) the same seed: 1,488 steps, 0.869.
        # Two images of each position under the board's rotations and reflections
        # (`text_lm.exit.symmetries=2`) gave 935 positions but 672 steps without AVX-512 (their base
        # readings), 0.836 (seed 3): not kept. Each position holds ~5.2 MB of base readings: 8 GB
        # keep a whole run's, where the default 3 GB begin to evict (and re-read, ~0.3 s each) after
        # ~590. (Turn-level PPO on the game's result, `text_ppo`, scored 0.54-0.65 after 30
        # minutes.)
        "roles": [{"name": "main", "kind": "main", "self_play": 0.0, "pfsp": 0.0, "uniform": 1.0}],
        "text_lm": {"model": {"readings_mb": 8192.0,
                              "lora": {"rank": 16, "alpha": 32.0, "activation_tokens": 4,
                                       "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"]}},
                    "play": {"max_new_tokens": 4, "temperature": 0.5}},
    },
    # The negotiation in plain English, one utterance per turn (games/builtin/negotiation_turns.py, the
    # English view in games/text.py): "[propose: 2 books, 1 hat, 0 balls]" or "[accept]". A proposal
    # is ~12 tokens after the opening "[" (24 allowed: the base often adds "for me" or more before
    # closing); the untrained base pins the scale. TrueSkill: higher own score wins, equal scores
    # draw. Opponents: 0.2 self-play, 0.8 uniformly over the base and the learner's snapshots (the
    # first, main@0, is the base itself; the next is due after 2,000 of its own turns, and 30
    # minutes here play fewer than 800 turns in all), so four matches in five meet a partner that
    # negotiates as the base does. With 0.3 self-play, 0.3 PFSP and 0.4 uniform over the random
    # mover, the base and the snapshots, a quarter met the base: the updates fitted self-play's
    # conventions, which did not carry over to the base as partner (the learner's deals with it
    # stayed at 0.70 in training), and seed 5 gained +0.70 / +0.41 over the base; with this mix
    # +1.50 [+0.88, +2.13], and the new seeds 6 and 7 +1.01 [+0.42, +1.59] and +0.96 [+0.32, +1.60]
    # on 200 pairs, +0.21 [-0.25, +0.68] and +1.14 [+0.70, +1.57] on 400; seed 6 again on a faster
    # AVX-512 host, 12 updates: +0.41 [-0.04, +0.86] on 400 (docs/llm.md). LoRA on the
    # attention and MLP projections of the top 8 layers, 16-turn minibatches at 5e-4: an iteration
    # of 32 matches took 120-180 s at first and 65-110 s once the answers were valid on the host of
    # the first runs, so 30 minutes made 12-19 updates of ~8 Adam steps (170-390 s on this 2-core
    # AMD host: 5-7 updates); valid first responses reach 0.9-0.99 by the seventh (seeds 0-3).
    # (Attention-only adapters in every layer with 64-turn steps at 2e-4 made 2-3 updates of two or
    # three steps in 30 minutes and left the format half learnt; docs/llm.md has the runs.) Prompts
    # are ~300 tokens and all distinct: 16-turn micro-batches read with gradients in the top 8
    # layers peak near 7 GB (32 turns through all 30 layers passed 24 GB). Advantages use SPIRAL's
    # role baseline (RAE): every position is new, so the value head (a linear probe on the prompt)
    # had little to go on; with it seed 0 gained +0.81 [+0.35, +1.27] over the base, with RAE +1.52
    # [+0.92, +2.12] after 7 iterations on this slower host; seed 5 (new, 5 iterations) +0.70
    # [+0.09, +1.30] (docs/llm.md). The base stays float32: in bfloat16 (text_lm.model.dtype,
    # adapters still float32) a host with AVX512-BF16 (the bf16 runs'; this one has no AVX-512)
    # plays and learns an iteration in about half the time (10-11 updates in 30 minutes), yet seeds
    # 0 and 5 gained +0.69 and -0.36 over the base against +1.52 and +0.70 in float32.
    # RAE's running means start at 0 and move by 1 - rae_decay per update. SPIRAL's 0.95 suits its
    # zero-sum games, where the returns average near 0, and its hundreds of steps. Here the returns
    # average 3-4 and a run makes 12-19 updates. At 0.95 the baselines were still 1.2-1.3 after 12
    # updates, so nearly every deal had a positive advantage. At 0.5 they follow the last two
    # batches. On seed 6, on the same AVX-512 host: +0.41 [-0.04, +0.86] at 0.95, +1.17 [+0.75,
    # +1.60] at 0.5, both on 400 pairs; at 0.5 seed 9 (new): +1.19 [+0.61, +1.77] on 200, seed 7:
    # +1.26 [+0.84, +1.68] on 400, seed 5: +1.33 [+0.73, +1.93] on 200 (docs/llm.md).
    "llm_negotiation": {
        "game": "negotiation_turns", "learner": "text_ppo", "iterations": 40, "matches_per_iteration": 32,
        "torch_threads": 2, "runner_threads": 2,
        "num_envs": 32, "snapshot_every_steps": 2000, "snapshot_win_rate_lcb": 0.0, "rating_share": 0.1,
        "anchors": ["base"], "draw_probability": 0.15,
        "roles": [{"name": "main", "kind": "main", "self_play": 0.2, "pfsp": 0.0, "uniform": 0.8}],
        "text_lm": {"model": {"lora": {"layers": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "gate_proj", "up_proj", "down_proj"]}},
                    "play": {"max_new_tokens": 24, "temperature": 0.7},
                    "ppo": {"learning_rate": 5e-4, "kl_coef": 0.02, "baseline": "rae", "rae_decay": 0.5,
                            "minibatch_size": 16, "micro_batch_size": 16}},
    },
    # Dialogue (docs/reference.md §4, docs/dialogue.md): a tiny LM imitates dialogues among the
    # four scripted negotiators (a population of styles, as a human corpus is) for 1200 steps,
    # then token-level PPO against itself, its snapshots and the scripted anchors, with KL 0.2 to
    # the imitation model, lr 3e-4 and one imitation batch every 4 RL updates. Measured over
    # seeds 0-9 with 2048 held-out contexts (docs/dialogue.md has the table): 800 imitation steps
    # left the language below the parseability targets on seeds 5 and 7; 1600 steps (with KL 0.2
    # or 0.1) made the imitation partner so good that seat 1's gain over it fell below 1.0 on
    # seeds 0 and 2; 1200 sits between. The value head is fitted to
    # the demonstrations' scores, so the value loss needs no clipping; no entropy bonus (the KL
    # penalty already keeps the policy near the imitation model, and entropy only adds noise to
    # the words). Uniform sampling outweighs PFSP so that the anchors and the imitation snapshot
    # stay in the mix (with PFSP 0.6 the learner met mostly its own tough snapshots and learnt to
    # concede in seat 1 to everyone: benchmarks/negotiation_skill.py). For the same reason
    # snapshots are rare (one per 90k own tokens, ~40 iterations): with one per 20k the pool
    # filled with the learner's own tough snapshots, and its seat-1 gain against the imitation
    # model fell from ~1.2 to 0.5-0.9 on seeds 1 and 2 (measured, 512 held-out contexts).
    # TrueSkill: higher own score wins, equal scores draw (outcomes_from_returns).
    "negotiation": {
        "game": "negotiation", "learner": "token_ppo", "iterations": 80, "matches_per_iteration": 128,
        "num_envs": 128, "snapshot_every_steps": 90_000, "snapshot_win_rate_lcb": 0.0, "rating_share": 0.2,
        "draw_probability": 0.15,
        "anchors": ["negotiator-fair", "negotiator-tough", "negotiator-soft", "random-split"],
        "roles": [{"name": "main", "kind": "main", "self_play": 0.1, "pfsp": 0.3, "uniform": 0.6,
                   "pfsp_weighting": "var"}],
        "dialogue": {"imitation_steps": 1200, "imitation_batch_size": 32, "imitation_lr": 3e-3,
                     "imitation_bots": ["negotiator-fair", "negotiator-tough", "negotiator-soft", "random-split"],
                     "token_ppo": {"lr": 3e-4, "kl_beta": 0.2, "imitation_every": 4, "value_clip": None,
                                   "ent_coef": 0.0, "minibatch_size": 32}},
    },
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def load_config(source: str, overrides: list[str] | None = None) -> LeagueConfig:
    """A preset name or a YAML file path, plus `key=value` overrides, validated."""
    if source in PRESETS:
        data = PRESETS[source]
    elif source.endswith((".yaml", ".yml")) or Path(source).exists():
        data = load_yaml(source)
    else:
        import difflib

        close = difflib.get_close_matches(source, preset_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{source!r} is neither a preset nor a YAML file{hint}; presets: "
                          f"{', '.join(preset_names())}")
    overrides = overrides or []
    if "roles" not in data and any(item.startswith("roles.") for item in overrides):
        # `--set roles.main.pfsp=...` on a config that keeps the default role: name it explicitly.
        data = {**data, "roles": [to_dict(role) for role in LeagueConfig.__dataclass_fields__["roles"].default]}
    return config_from_dict(apply_overrides(data, overrides))


def config_from_dict(data: dict[str, Any]) -> LeagueConfig:
    config = from_dict(LeagueConfig, _with_role_nets(data))
    from ludus.games.core import GameError
    from ludus.games.registry import spec

    try:
        spec(config.game)  # an unknown game id fails here, before anything runs
    except GameError as exc:
        raise ConfigError(f"config key 'game': {exc}") from None
    return config


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
