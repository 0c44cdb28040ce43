"""Dialogue games in the league: language-model policies, the token-PPO league learner and the
imitation warm start. The negotiation evaluation is ludus.evaluation.negotiation.

A dialogue game (games/dialogue.py) is played one word token per action, so a causal language
model is a policy (agents/lm/model.py) and token-level PPO (agents/rl/token_ppo.py) trains it. This module
connects them to the league:

* `LMArchitecture.build` rebuilds a learner's LM in a runner.
* `dialogue_episodes` turns the runner's per-decision rows (`RolloutBatch`: the seat's token-id
  observation, the token it emitted, behaviour log-prob and value) back into whole dialogues, one
  row per (slot, seat) game, aligned by token position as `TokenBatch` expects. A seat's
  observation is a causal prefix of everything it has seen, so its last observation plus its last
  token is the whole dialogue from its side, and the token it emitted at each decision sits right
  after that decision's observation.
* `TokenPPOLeagueLearner` is the `LeagueLearner` of learner kind 'token_ppo' (league/learners/kinds.py): before any
  league RL it behaviour-clones scripted dialogues (Lewis et al. 2017, "Deal or No Deal?", §3: a
  supervised model first, then RL); the imitation model is its first snapshot (`main@0`) and the
  frozen reference of the KL penalty (Ziegler et al. 2019, eq. 2); one imitation batch every
  `token_ppo.imitation_every` RL updates keeps the language from drifting (Lewis et al. §4).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ludus.agents.lm.generation import LMPolicy
from ludus.agents.lm.model import LMWithValueHead, TinyLMConfig, build_tiny_lm, frozen_copy
from ludus.agents.ppo_core import prefixed
from ludus.agents.rollout import RolloutBatch
from ludus.agents.snapshot import Lineage, SnapshotRef
from ludus.agents.rl.token_ppo import ImitationStats, TokenBatch, TokenPPOLearner
from ludus.games.core import GameSpec
from ludus.league.configio import ConfigError
from ludus.league.seeds import rng_from_tensor, rng_to_tensor

PAD_ID = 0
"""Every dialogue vocabulary has <pad> at id 0 (ludus.games.dialogue.Vocabulary); LM rows are right-padded with it."""


# ----------------------------------------------------------------------------------- policies


def lm_config_for_game(spec: GameSpec, lm: TinyLMConfig) -> TinyLMConfig:
    """The tiny LM of a token game: `lm` with the game's vocabulary size; refuses a model too short
    to read a whole dialogue (the last observation plus the last token)."""
    if spec.observation_dtype != "int64" or len(spec.observation_shape) != 1:
        raise ConfigError(f"learner 'token_ppo' plays token games (int64 observation rows); {spec.id!r} "
                          f"has {spec.observation_dtype} observations of shape {spec.observation_shape}")
    config = dataclasses.replace(lm, vocab_size=spec.num_actions)
    needed = spec.observation_shape[0] + 1
    if config.n_positions < needed:
        raise ConfigError(f"config key 'dialogue.lm.n_positions' is {config.n_positions}; {spec.id!r} "
                          f"dialogues need {needed} positions")
    return config


@dataclass(frozen=True)
class LMArchitecture:
    """A tiny LM with a value head acting through `LMPolicy` (learner 'token_ppo')."""

    tiny_lm: TinyLMConfig
    lm_base = None

    def build(self, spec: GameSpec) -> tuple[LMWithValueHead, LMPolicy]:
        if self.tiny_lm.vocab_size != spec.num_actions:
            raise ConfigError(f"LM architecture has {self.tiny_lm.vocab_size} tokens, {spec.id!r} has "
                              f"{spec.num_actions}")
        model = build_tiny_lm(self.tiny_lm, seed=0)
        return model, LMPolicy(model, pad_id=PAD_ID)


def lm_architecture(spec: GameSpec, lm: TinyLMConfig) -> LMArchitecture:
    return LMArchitecture(lm_config_for_game(spec, lm))


# --------------------------------------------------------------------- rows -> dialogues


@dataclass(frozen=True)
class DialogueEpisodes:
    """A learner's finished games from its own side, one row per (slot, seat) game, aligned by
    token position (position t holds token t; own positions hold the decision that emitted it)."""

    input_ids: np.ndarray
    """[E, W] int64 the whole dialogue as the seat saw it, right-padded with PAD_ID (W = obs length + 1)."""
    own_mask: np.ndarray
    """[E, W] bool positions of the tokens the seat emitted."""
    log_probs: np.ndarray
    """[E, W] float32 behaviour log-prob of each own token (0 elsewhere)."""
    values: np.ndarray
    """[E, W] float32 behaviour value of the state each own token was chosen in (0 elsewhere)."""
    legal_mask: np.ndarray
    """[E, W, V] bool legal tokens at each own position (all False elsewhere)."""
    scores: np.ndarray
    """[E] float32 the seat's return: the sum of its rewards over the game."""
    seats: np.ndarray
    """[E] int64 the seat the learner played."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def token_batch(self, ref_log_probs: np.ndarray) -> TokenBatch:
        return TokenBatch(self.input_ids, self.own_mask, self.log_probs, self.values, ref_log_probs,
                          self.scores, self.legal_mask, roles=self.seats)


def _row_lengths(obs: np.ndarray, pad_id: int) -> np.ndarray:
    """One past the last non-pad token of each row (0 for an all-pad row)."""
    real = obs != pad_id
    return np.where(real.any(axis=1), obs.shape[1] - np.argmax(real[:, ::-1], axis=1), 0).astype(np.int64)


def dialogue_episodes(batch: RolloutBatch, pad_id: int = PAD_ID) -> DialogueEpisodes:
    """Whole dialogues from the runner's rows: rows come grouped by (slot, seat) in time order
    (several games of a slot follow each other, separated by `dones`; batches of several runners
    are concatenated), so a game is a run of rows with the same (slot, seat) ending at a done row.

    Each row's token lands right after its observation (position = the observation's length);
    the game's last observation plus its last token is the whole dialogue from that seat's side.
    Every earlier observation must be a prefix of it: a ValueError names the row that is not
    (rows of an unfinished game, or observations that are not causal token prefixes).
    """
    n = len(batch)
    if n == 0:
        raise ValueError("dialogue_episodes: empty batch")
    obs = np.asarray(batch.obs)
    if obs.ndim != 2 or not np.issubdtype(obs.dtype, np.integer):
        raise ValueError(f"dialogue_episodes reads [N, L] token-id observations, got {obs.dtype} {obs.shape}")
    width = obs.shape[1] + 1
    key = np.asarray(batch.slots, np.int64) * (int(np.max(batch.seats)) + 1) + np.asarray(batch.seats, np.int64)
    dones = np.asarray(batch.dones, bool)
    starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | dones[:-1]])
    ends = np.r_[starts[1:], n]
    if not dones[ends - 1].all():
        bad = int(ends[np.flatnonzero(~dones[ends - 1])[0]] - 1)
        raise ValueError(f"dialogue_episodes: the game ending at row {bad} is not finished (done is False); "
                         f"the runner records whole games only")
    lengths = _row_lengths(obs, pad_id)
    if (lengths == 0).any():
        raise ValueError(f"dialogue_episodes: row {int(np.flatnonzero(lengths == 0)[0])} observes only padding")
    num, vocab = len(starts), batch.mask.shape[1]
    input_ids = np.full((num, width), pad_id, dtype=np.int64)
    own = np.zeros((num, width), dtype=bool)
    log_probs = np.zeros((num, width), dtype=np.float32)
    values = np.zeros((num, width), dtype=np.float32)
    legal = np.zeros((num, width, vocab), dtype=bool)
    episode_of_row = np.repeat(np.arange(num), ends - starts)
    last = ends - 1
    input_ids[np.arange(num), :width - 1] = obs[last]
    input_ids[np.arange(num), lengths[last]] = batch.actions[last]
    # Causal prefix check: every row's observation, then its token, agrees with its game's dialogue.
    columns = np.arange(width - 1)
    seen = columns[None, :] < lengths[:, None]
    mismatch = seen & (obs != input_ids[episode_of_row, :width - 1])
    mismatch |= (input_ids[episode_of_row, lengths] != batch.actions)[:, None]
    if mismatch.any():
        bad = int(np.flatnonzero(mismatch.any(axis=1))[0])
        raise ValueError(f"dialogue_episodes: row {bad} is not a prefix of its game's final observation; "
                         f"the game's observations must be causal token prefixes")
    if np.any(np.diff(lengths)[np.diff(episode_of_row) == 0] <= 0):
        raise ValueError("dialogue_episodes: a seat's observations do not grow within a game")
    own[episode_of_row, lengths] = True
    log_probs[episode_of_row, lengths] = batch.logprobs
    values[episode_of_row, lengths] = batch.values
    legal[episode_of_row, lengths] = batch.mask
    scores = np.add.reduceat(np.asarray(batch.rewards, np.float64), starts).astype(np.float32)
    return DialogueEpisodes(input_ids, own, log_probs, values, legal, scores,
                            np.asarray(batch.seats, np.int64)[starts])


# --------------------------------------------------------------------------- imitation data


def is_negotiation(spec: GameSpec) -> bool:
    return spec.id == "negotiation" or spec.id.startswith("negotiation(")


@dataclass(frozen=True)
class ImitationData:
    """Demonstration transcripts, one seat's side of a scripted dialogue per row."""

    tokens: np.ndarray
    """[M, L] int64 the seat's final observation (the whole dialogue from its side)."""
    targets: np.ndarray
    """[M, L] bool the tokens the seat emitted (what a next-token model imitates)."""
    legal: np.ndarray
    """[M, L, V] bool the legal tokens at each target."""
    scores: np.ndarray
    """[M] float32 the seat's final score in that dialogue (targets of the critic's warm start)."""

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, rows: np.ndarray) -> TokenBatch:
        return TokenBatch.for_imitation(self.tokens[rows], self.targets[rows], self.legal[rows])


def require_demonstrators(spec: GameSpec) -> None:
    """Imitation needs scripted demonstrators; only the negotiation game has them."""
    if not is_negotiation(spec):
        raise ConfigError(f"imitation needs scripted demonstrators, and only the negotiation game has them; "
                          f"for {spec.id!r} set dialogue.imitation_steps=0 and dialogue.token_ppo.imitation_every=0")


def imitation_data(spec: GameSpec, bots: Sequence[str], num_dialogues: int, seed: int) -> ImitationData:
    """Seeded scripted dialogues of the negotiation game: `num_dialogues` split evenly over every
    ordered pair of the bots `bots` (names for `ludus.agents.bots.builtin.make_bot`)."""
    from ludus.agents.bots.builtin import make_bot
    from ludus.agents.bots.scripted_negotiator import generate_dialogues
    from ludus.games import registry

    require_demonstrators(spec)
    rules = registry.make(spec.id).rules
    pairs = [(a, b) for a in bots for b in bots]
    seeds = np.random.SeedSequence(seed).spawn(len(pairs))
    samples = []
    for index, (a, b) in enumerate(pairs):
        count = num_dialogues // len(pairs) + (index < num_dialogues % len(pairs))
        if count:
            pair_seed = int(seeds[index].generate_state(1, np.uint32)[0])
            samples += generate_dialogues(count, pair_seed, [make_bot(a, spec), make_bot(b, spec)], rules)
    transcripts = [t for s in samples for t in s.seats]
    scores = np.array([s.record.scores[seat] for s in samples for seat in (0, 1)], dtype=np.float32)
    return ImitationData(np.stack([t.tokens for t in transcripts]), np.stack([t.targets for t in transcripts]),
                         np.stack([t.legal for t in transcripts]), scores)


def fit_value_head(model: LMWithValueHead, data: ImitationData, rows: np.ndarray, ridge: float = 1e-2) -> float:
    """Set the value head to the ridge least-squares fit of the demonstrations' final scores on the
    trunk's hidden states at every own decision; returns the fit's explained variance.

    Why: the value head starts random (V ~ 0) while scores are 0-10. PPO's clipped value loss then
    moves values 0.2 per update, and an unclipped one sends large value gradients into the trunk the
    policy shares, scrambling the imitated language in the first updates. The head is linear, so on
    fixed trunk features the best fit is a closed-form solve (no trunk change, about a second)."""
    tokens = data.tokens[rows]
    own = data.targets[rows]
    width = int(np.flatnonzero(own.any(axis=0)).max()) + 1
    with torch.inference_mode():
        hidden, _ = model.trunk(torch.from_numpy(np.ascontiguousarray(tokens[:, :width])))
    hidden = hidden.double().numpy()
    # values[:, t-1] is the value of the state in which token t is chosen (agents/lm/model.py).
    decision = own[:, 1:width]
    features = hidden[:, :width - 1][decision]
    targets = np.repeat(data.scores[rows].astype(np.float64), decision.sum(axis=1))
    design = np.concatenate([features, np.ones((len(features), 1))], axis=1)
    gram = design.T @ design + ridge * len(features) * np.diag(np.r_[np.ones(features.shape[1]), 0.0])
    solution = np.linalg.solve(gram, design.T @ targets)
    with torch.no_grad():
        model.value_head.weight.copy_(torch.from_numpy(solution[:-1]).float()[None, :])
        model.value_head.bias.fill_(float(solution[-1]))
    residual = targets - design @ solution
    return float(1.0 - residual.var() / targets.var()) if targets.var() > 0 else 0.0


# ------------------------------------------------------------------------------ the learner

VALUE_FIT_ROWS = 1024
"""Demonstration transcripts the value head's warm start is fitted on."""


@dataclass(frozen=True)
class WarmStartReport:
    """What the imitation warm start did."""

    steps: int
    seconds: float
    first: ImitationStats | None
    """Stats of the first step (before any learning)."""
    last: ImitationStats | None
    """Stats of the last step."""
    value_explained_variance: float
    """How well the value head's least-squares warm start fits the demonstrations' scores (nan: none)."""


class TokenPPOLeagueLearner:
    """Token-level PPO on a tiny LM, as a `ludus.league.learners.base.LeagueLearner`.

    Created with a freshly initialised model (`init_seed`); the imitation warm start
    (`dialogue.imitation_steps` behaviour-cloning steps on seeded scripted dialogues) runs once, at
    the first use of the learner's weights (`module`, `freeze`, `update`, `state_dict`), which in
    a new league is the freezing of its first snapshot. A resumed league restores the trained state
    with `load_state_dict` instead and never repeats it. Everything is seeded: `init_seed` for the
    weights, `seed` for imitation minibatches, imitation data and PPO minibatch shuffling.
    """

    def __init__(self, spec: GameSpec, config, role_index: int, seed: int, init_seed: int):
        self.spec = spec
        self.dialogue = config.dialogue
        self.role_index = role_index
        self.seed = seed
        self.lm_config = lm_config_for_game(spec, self.dialogue.lm)
        self.architecture = lm_architecture(spec, self.dialogue.lm)
        if self.dialogue.imitation_steps or self.dialogue.token_ppo.imitation_every:
            require_demonstrators(spec)
        streams = np.random.SeedSequence(seed).spawn(3)
        self._data_seed = int(streams[0].generate_state(1, np.uint32)[0])
        self._imitation_rng = np.random.default_rng(streams[1])
        self._ppo_seed = int(streams[2].generate_state(1, np.uint32)[0])
        self._model = build_tiny_lm(self.lm_config, init_seed)
        self._learner: TokenPPOLearner | None = None
        self._data: ImitationData | None = None
        self._updates = 0
        self.warm_start: WarmStartReport | None = None

    # -- the warm start ----------------------------------------------------------------------

    def _imitation(self) -> ImitationData:
        if self._data is None:
            d = self.dialogue
            self._data = imitation_data(self.spec, d.imitation_bots, d.imitation_dialogues, self._data_seed)
        return self._data

    def _imitation_batch(self) -> TokenBatch:
        data = self._imitation()
        size = min(self.dialogue.imitation_batch_size, len(data))
        return data.batch(np.sort(self._imitation_rng.choice(len(data), size=size, replace=False)))

    def _ready(self) -> TokenPPOLearner:
        """The RL learner, after running the warm start if it has not run yet."""
        if self._learner is None:
            d = self.dialogue
            start = time.perf_counter()
            first = last = None
            value_fit = float("nan")
            if d.imitation_steps:
                cloner = TokenPPOLearner(self._model, config=dataclasses.replace(d.token_ppo, lr=d.imitation_lr))
                for step in range(d.imitation_steps):
                    # Linear annealing to 0 (as CleanRL anneals PPO's): the last steps polish the
                    # token distributions that decide whether sampled utterances parse.
                    cloner.backend.set_learning_rate(d.imitation_lr * (1 - step / d.imitation_steps))
                    last = cloner.imitation_update(self._imitation_batch())
                    first = first or last
                data = self._imitation()
                rows = np.sort(self._imitation_rng.choice(len(data), size=min(VALUE_FIT_ROWS, len(data)),
                                                          replace=False))
                value_fit = fit_value_head(self._model, data, rows)
            self.warm_start = WarmStartReport(d.imitation_steps, time.perf_counter() - start, first, last,
                                              value_fit)
            # The imitation model is the frozen reference of the KL penalty; RL starts a fresh optimizer.
            self._learner = TokenPPOLearner(self._model, ref_model=self._model, config=d.token_ppo,
                                            seed=self._ppo_seed)
        return self._learner

    # -- LeagueLearner ------------------------------------------------------------------------

    @property
    def module(self) -> LMWithValueHead:
        return self._ready().model

    @property
    def updates(self) -> int:
        return self._updates

    @property
    def reference(self) -> LMWithValueHead:
        """The frozen reference model (the imitation model)."""
        return self._ready().ref_model

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        """One token-PPO update on the learner's finished games (and an imitation batch when due).
        The learning rate stays constant (`progress` is unused), as in the prototype."""
        learner = self._ready()
        episodes = dialogue_episodes(batch)
        ref = learner.reference_log_probs(episodes.input_ids, episodes.legal_mask)
        stats = learner.update(episodes.token_batch(ref))
        out = {k: float(v) for k, v in dataclasses.asdict(stats).items()}
        out["games"] = float(len(episodes))
        if learner.imitation_due:
            imitation = learner.imitation_update(self._imitation_batch())
            out["imitation_nll"] = imitation.nll
            out["imitation_accuracy"] = imitation.accuracy
        if is_negotiation(self.spec):
            out.update(negotiation_episode_stats(episodes))
        self._updates += 1
        return out

    def freeze(self, directory: Path, lineage: Lineage) -> SnapshotRef:
        from ludus.agents.lm.snapshots import save_lm_snapshot

        return save_lm_snapshot(self.module, self.spec, directory, lineage)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything an exact resume needs: model, reference, Adam state, RNGs, KL coefficient, counters."""
        learner = self._ready()
        state = {f"model.{k}": v.detach().clone() for k, v in learner.model.state_dict().items()}
        state.update({f"reference.{k}": v.detach().clone() for k, v in learner.ref_model.state_dict().items()})
        state.update({f"optimizer.{k}": v for k, v in learner.backend.state_dict().items()})
        state["ppo_rng"] = rng_to_tensor(learner.rng)
        state["imitation_rng"] = rng_to_tensor(self._imitation_rng)
        state["kl_beta"] = torch.tensor(learner.kl_controller.value, dtype=torch.float64)
        state["counters"] = torch.tensor([self._updates, learner.rl_updates, learner.rl_updates_since_imitation],
                                         dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._model.load_state_dict(prefixed(state, "model."), strict=True)
        reference = build_tiny_lm(self.lm_config, seed=0)
        reference.load_state_dict(prefixed(state, "reference."), strict=True)
        learner = TokenPPOLearner(self._model, ref_model=reference, config=self.dialogue.token_ppo,
                                  seed=self._ppo_seed)
        learner.backend.load_state_dict(prefixed(state, "optimizer."))
        learner.rng = rng_from_tensor(state["ppo_rng"])
        self._imitation_rng = rng_from_tensor(state["imitation_rng"])
        learner.kl_controller.value = float(state["kl_beta"])
        self._updates, learner.rl_updates, learner.rl_updates_since_imitation = (
            int(x) for x in state["counters"].tolist())
        self._learner = learner

    def reset_to(self, snapshot: Path, seed: int) -> None:
        """Restart from a snapshot's weights with a fresh optimizer; the reference stays the imitation model."""
        from ludus.agents.lm.snapshots import load_lm_snapshot

        reference = self.reference
        loaded = load_lm_snapshot(snapshot, expect_game=self.spec.id)
        self._model.load_state_dict(loaded.lm.model.state_dict(), strict=True)
        learner = TokenPPOLearner(self._model, ref_model=reference, config=self.dialogue.token_ppo, seed=seed)
        learner.rl_updates = self._learner.rl_updates if self._learner else 0
        self._learner = learner


# ---------------------------------------------------------------------- negotiation metrics


def negotiation_episode_stats(episodes: DialogueEpisodes) -> dict[str, float]:
    """Per-iteration negotiation metrics from the learner's side of its games.

    `own_parseable_rate` and `own_distinct_utterances` are over the learner's own utterances.
    `agreement_rate` counts games with a positive own score or closed by the learner's own valid
    `deal` (a deal worth 0 to the learner that the partner closed is invisible from this side).
    """
    from ludus.games.builtin.negotiation import DEAL_ID, UtteranceKind, parse_observation, parse_utterance

    own_total = own_parsed = agreed = 0
    distinct: set[tuple[int, ...]] = set()
    for row, score in zip(episodes.input_ids, episodes.scores):
        # The row ends with the learner's last token, always an <eou>: its utterances are all finished.
        view = parse_observation(row)
        mine = [u for u in view.utterances if u.mine]
        own_total += len(mine)
        own_parsed += sum(parse_utterance(u.words, view.counts).kind is not UtteranceKind.CHAT for u in mine)
        distinct.update(u.words for u in mine)
        standing = view.standing_offer()
        closed_by_me = (bool(view.utterances) and view.utterances[-1].mine
                        and view.utterances[-1].words == (DEAL_ID,) and standing is not None and not standing[0])
        agreed += bool(score > 0 or closed_by_me)
    n = max(len(episodes), 1)
    return {"agreement_rate": agreed / n,
            "own_parseable_rate": own_parsed / own_total if own_total else 0.0,
            "own_distinct_utterances": float(len(distinct))}


def lm_policy_of(learner: TokenPPOLeagueLearner | LMWithValueHead) -> LMPolicy:
    """An LMPolicy acting with a frozen copy of a learner's (or a model's) current weights."""
    model = learner.module if isinstance(learner, TokenPPOLeagueLearner) else learner
    return LMPolicy(frozen_copy(model), pad_id=PAD_ID)


__all__ = ["PAD_ID", "LMArchitecture", "lm_architecture", "lm_config_for_game", "DialogueEpisodes",
           "dialogue_episodes", "ImitationData", "imitation_data", "require_demonstrators", "fit_value_head",
           "TokenPPOLeagueLearner", "WarmStartReport", "negotiation_episode_stats", "lm_policy_of"]
