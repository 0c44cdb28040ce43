"""A pretrained language model playing a game through its text view.

Each decision the LM reads the game as chat messages (system: the rules and its role; user: the
position and the legal answers) and writes one whole response; the view parses it into an action
(games/text.py). All rows of one `act` call — every seat this LM plays across the runner's
concurrent matches — are generated in one batch, the shared prompt prefix (chat header and rules)
read once (`LMPolicy.generate`), sampling from the run's seeded generator, so a seeded run is
reproducible.

A response that names no legal action is never a crash: the row samples again, up to
`invalid.retries` times, and then plays a uniformly random legal action. The FIRST response of
every turn is what the learner trains on (`ActOutput.responses`); when it did not count, the
learner scores that turn as `-invalid.penalty` instead of the game's outcome, as SPIRAL scores
a malformed move as a loss (Liu et al. 2025, §3) — but the game goes on, so one bad sample never
decides a match between two agents.

The prompt format is data (`PromptFormat`): system and user templates, and an optional "think,
then answer" instruction with its longer response budget.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ludus.agents.lm.generation import LMPolicy
from ludus.agents.lm.model import LMError, LMWithValueHead
from ludus.agents.lm.prompt_cache import BaseReadings, PromptStore, base_readings
from ludus.agents.policy import ActBatch, ActOutput, sample_legal_uniform
from ludus.games.core import GameError
from ludus.games.text import (ParsedResponse, TextView, answer_pattern, is_free_text, normal_answer, parse_response,
                              told)
from ludus.bounds import bounds, range_problem


MAX_NEW_TOKENS = 4096
"""Most tokens one response may have (`TextPlayConfig.max_new_tokens`), whatever the model's context."""


@dataclass(frozen=True)
class PromptFormat:
    """How a turn is put to the LM: chat messages built from the view's text."""

    system: str = "{rules}"
    """System message; {rules}, {role}, {title}, {state} (the position and legal answers) and
    {instruction} are filled in from the game's text view."""
    user: str = "{role} {state}\n{instruction}"
    """User message, with the same fields. (The role goes here, not in the system message, so that
    the system message is the same for every seat: one shared prefix for the whole batch.)"""
    answer_instruction: str = "Reply with your action in square brackets and nothing else."
    """The instruction when `think` is off."""
    think: bool = False
    """Ask the LM to reason before answering ("think, then answer"); needs a larger max_new_tokens."""
    think_instruction: str = "Think step by step in one or two sentences, then give your action in square brackets."
    """The instruction when `think` is on."""
    response_prefix: str = "["
    """Text the response starts with, written for the LM (prefilled): "[" puts a small model straight
    into the answer format; "" leaves the whole response to it (with `think`, it must be "")."""
    answer_pattern: str = r"\[([^\[\]\n]{1,80})\]"
    """How the final answer is written, a regular expression whose one group is the answer: square
    brackets (TextArena's convention) by default; e.g. ``\\boxed\{([^{}]{1,80})\}`` for SPIRAL's.
    Only the answer is parsed; the whole response is generated and trained."""
    reasoning_end: str = "</think>"
    """With `think`: where the reasoning ends. In a free-text game the text after it is the move
    the opponent hears (the reasoning stays private); a response without it plays its last answer."""

    def messages(self, view: TextView, obs: np.ndarray, seat: int, mask: np.ndarray) -> list[dict[str, str]]:
        view, obs, mask = told(view, obs, mask)  # a mix of games: the prompt of the game `obs` is from
        instruction = self.think_instruction if self.think else self.answer_instruction
        fields = dict(rules=view.rules(), role=view.role(seat), title=view.title,
                      state=view.state(obs, seat, mask), instruction=instruction)
        system, user = self.system.format(**fields), self.user.format(**fields)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def __post_init__(self) -> None:
        if self.think and self.response_prefix:
            raise LMError("prompt.think needs prompt.response_prefix '' (the response starts with the reasoning)")
        try:
            answer_pattern(self.answer_pattern)
        except GameError as exc:
            raise LMError(f"prompt.{exc}") from None
        for name in ("system", "user"):
            problem = template_problem(getattr(self, name))
            if problem:
                raise LMError(f"prompt.{name} {problem}")


@dataclass(frozen=True)
class InvalidResponses:
    """What happens when a response names no legal action."""

    retries: int = field(default=2, metadata=bounds(0, 100))
    """New samples the turn may take before the turn fails."""
    forfeit: bool = False
    """A failed turn forfeits the match (recorded in the ledger as the seat's 'invalid' status, the
    game's worst return for it); False plays a uniformly random legal action instead."""
    penalty: float = field(default=1.0, metadata=bounds(0, 1000))
    """The learner scores a turn whose first response did not count as -penalty (not the game's result)."""
    feedback: bool = False
    """Each retry is told why the answer before it did not count (as Kaggle's game harness does:
    the response, then the game's message and the legal answers, then a new answer); False
    samples again from the same prompt. Off by default: a retry that reads the failed response
    has no closed form, so the policy's exact action distribution (`action_probabilities`, exact
    exploitability) is then estimated by sampling. Free-text games judge moves themselves
    (TextArena tells the seat why in its next observation) whatever this says."""

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise LMError(f"invalid.retries must be >= 0, got {self.retries}")
        if self.penalty < 0:
            raise LMError(f"invalid.penalty must be >= 0, got {self.penalty}")


@dataclass(frozen=True)
class TextPlayConfig:
    """How an LM plays text games: prompts, response budget, invalid responses."""

    max_new_tokens: int = field(default=8, metadata=bounds(1, MAX_NEW_TOKENS))
    """Tokens one response may have (the stop token included)."""
    temperature: float = field(default=1.0, metadata=bounds(0, 100, low_open=True))
    """Sampling temperature; the learner's log-probs are of the same tempered distribution."""
    prompt: PromptFormat = field(default_factory=PromptFormat)
    """The prompt format."""
    invalid: InvalidResponses = field(default_factory=InvalidResponses)
    """Invalid responses: retries and the learner's penalty."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise LMError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise LMError(f"temperature must be > 0, got {self.temperature}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: Any, context: int | None = None) -> "TextPlayConfig":
        """The settings a snapshot records, checked as strictly as a config's: unknown keys, wrong
        types, values outside their ranges (`max_new_tokens` also within the model's `context`
        when given) and prompt templates that fill in anything but `PROMPT_FIELDS` are refused
        with a one-line `LMError`; keys left out take their defaults."""
        play = _strict(TextPlayConfig, data, "")
        if context is not None and play.max_new_tokens >= context:
            raise LMError(f"play.max_new_tokens={play.max_new_tokens} does not fit the model's context of "
                          f"{context} tokens (with the prompt): record a smaller one")
        return play


PROMPT_FIELDS = ("rules", "role", "title", "state", "instruction")
"""What a prompt template may fill in: the game's text view gives the rules, the seat's role, the
title and the state; the instruction is `PromptFormat`'s."""


def template_problem(template: Any) -> str | None:
    """Why `template` cannot be a prompt template (str.format with `PROMPT_FIELDS` by name, no
    format spec, conversion, index or attribute), or None."""
    import string

    if not isinstance(template, str):
        return f"must be a string, got {type(template).__name__}"
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"is not a format template ({exc}): write a literal brace as {{{{ or }}}}"
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PROMPT_FIELDS:
            return (f"fills in {{{name}}}, which the game's text view does not give: use "
                    f"{', '.join('{' + f + '}' for f in PROMPT_FIELDS)}")
        if spec or conversion:
            return f"formats {{{name}}} with {'!' + conversion if conversion else ':' + spec}: use plain {{{name}}}"
    return None


def _strict(cls: type, data: Any, prefix: str) -> Any:
    """`cls` (a settings dataclass) from JSON `data`: unknown keys and wrong types refused in one line."""
    if not isinstance(data, Mapping):
        raise LMError(f"{prefix.rstrip('.') or 'the play settings'} must be a mapping, got {type(data).__name__}")
    known, fields = typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise LMError(f"unknown key {prefix}{unknown[0]} (known: {', '.join(known)})")
    kwargs = {}
    for name, value in data.items():
        tp = known[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _strict(tp, value, f"{prefix}{name}.")
            continue
        ok = (isinstance(value, bool) if tp is bool else
              isinstance(value, int) and not isinstance(value, bool) if tp is int else
              isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float else
              isinstance(value, tp))
        if not ok:
            raise LMError(f"{prefix}{name} must be {tp.__name__}, got {value!r:.40}")
        problem = range_problem(fields[name], value, prefix + name)
        if problem:
            raise LMError(problem)
        kwargs[name] = float(value) if tp is float else value
    return cls(**kwargs)  # __post_init__: the checks across keys


def token_texts(tokenizer: Any) -> dict[int, str]:
    """The text of every vocabulary token, decoded once per tokenizer (~1 s for 49k tokens)."""
    texts = tokenizer.__dict__.get("_ludus_token_texts")
    if texts is None:
        texts = tokenizer.__dict__["_ludus_token_texts"] = {i: tokenizer.decode([i])
                                                           for i in tokenizer.get_vocab().values()}
    return texts


def closing_bracket_tokens(tokenizer: Any) -> list[int]:
    """Ids of every vocabulary token whose text holds "]"."""
    return sorted(i for i, t in token_texts(tokenizer).items() if "]" in t)


class PromptEncoder:
    """Token ids of a turn's prompt (chat template applied, generation prompt added), memoised:
    the same position is asked many times in a league."""

    def __init__(self, tokenizer: Any, view: TextView, prompt: PromptFormat, cache_size: int = 4096):
        self.tokenizer, self.view, self.prompt = tokenizer, view, prompt
        self.cache: dict[tuple, list[int]] = {}
        self.cache_size = cache_size

    def __call__(self, obs: np.ndarray, seat: int, mask: np.ndarray) -> list[int]:
        key = (np.asarray(obs).tobytes(), int(seat), np.asarray(mask, dtype=bool).tobytes())
        ids = self.cache.get(key)
        if ids is None:
            messages = self.prompt.messages(self.view, obs, seat, mask)
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = self.tokenizer(text + self.prompt.response_prefix, add_special_tokens=False)["input_ids"]
            if len(self.cache) >= self.cache_size:
                self.cache.clear()
            self.cache[key] = ids
        return ids

    def retry(self, obs: np.ndarray, seat: int, mask: np.ndarray, response: str, problem: str) -> list[int]:
        """The prompt of a retry: the turn's messages, the response that did not count, and the
        game's message saying why, with the legal answers (not memoised: each retry is its own)."""
        legal = " ".join(f"[{a}]" for a in self.view.answers(obs, seat, mask))
        feedback = f"That answer does not count ({problem}). Your legal moves: {legal}. Answer again."
        messages = self.prompt.messages(self.view, obs, seat, mask) + [
            {"role": "assistant", "content": response}, {"role": "user", "content": feedback}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text + self.prompt.response_prefix, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class TextTurns:
    """What one `act` call generated, beyond the actions (for play and tests)."""

    texts: tuple[str, ...]
    """The first response of each row."""
    parsed: tuple[ParsedResponse, ...]
    """What each first response meant."""
    attempts: np.ndarray
    """[N] responses each row took (1 when the first counted; retries + 1 then a random move otherwise)."""
    fallback: np.ndarray
    """[N] bool: no response counted (the turn failed): a random legal action was played, or the
    seat forfeits (`InvalidResponses.forfeit`)."""
    all_texts: tuple[tuple[str, ...], ...] = ()
    """Every response of each row, retries included, in order."""
    moves: tuple[str | None, ...] = ()
    """Free-text games: the move each row plays (what the game judges); None elsewhere."""


class TextLMPolicy:
    """A `Policy` for games with a text view, acting with a pretrained LM (agents/lm/pretrained.py).

    `adapters`: tensors to load into `model` before acting. Frozen snapshots of one base share one
    model in a process (each policy swaps its few MB of adapters in), so a runner holding ten LM
    snapshots holds one base; None acts with the model as it is (a learner's own policy). With
    adapters, the policy keeps the prompts it has read (`prompts`, a `PromptStore`): whoever
    changes the adapter tensors calls `weights_changed()`.
    """

    needs_history = False

    def __init__(self, model: LMWithValueHead, tokenizer: Any, view: TextView, play: TextPlayConfig,
                 adapters: Mapping[str, torch.Tensor] | None = None):
        self.model, self.tokenizer, self.view, self.play = model, tokenizer, view, play
        self.adapters = dict(adapters) if adapters is not None else None
        self.encode = PromptEncoder(tokenizer, view, play.prompt)
        self.stop_token = int(tokenizer.eos_token_id)
        # Opened with "[", a response is over at its closing bracket: every token holding "]" stops it.
        self.stop_tokens = [self.stop_token] + (closing_bracket_tokens(tokenizer) if play.prompt.response_prefix else [])
        self.first_answer = bool(play.prompt.response_prefix)
        self.pattern = answer_pattern(play.prompt.answer_pattern)
        self.free_text = is_free_text(view)
        """Every game of the view lists no answers (a view of several games decides row by row: `act`)."""
        self.mixed = getattr(view, "part", None) is not None
        self.generator = LMPolicy(model, pad_id=self.stop_token)
        # the prompts' readings by one set of adapters (a frozen snapshot's, or a runner copy's until
        # its next weights), kept for one task; activated adapters read the base's instead, kept for
        # the run (`readings`)
        self.prompts = PromptStore() if adapters is not None and not model.activation_tokens else None
        self.last_turns: TextTurns | None = None
        self.counts = {"turns": 0, "first_valid": 0, "fallback": 0}
        """Turns played, turns whose first response counted, turns played by the random fallback."""

    def readings(self) -> PromptStore | BaseReadings | None:
        """Where prompts read before are found: with activated adapters the base's readings, shared
        in the process and kept for the run (agents/lm/prompt_cache.py `BaseReadings`), else `prompts`."""
        return base_readings(self.model) if self.model.activation_tokens else self.prompts

    def activate(self) -> None:
        """Put this policy's adapters into the (shared) model before it computes anything."""
        if self.adapters is not None:
            self.model.load_state_dict(self.adapters, strict=False)

    def weights_changed(self) -> None:
        """The adapter tensors were replaced: prompts read with the old ones are forgotten."""
        if self.prompts is not None:
            self.prompts.clear()

    def forget_readings(self) -> None:
        """`ludus.agents.policy.KeepsReadings`: the runner starts every task with an empty prompt store
        (the base's readings of activated adapters are the same floats however read: kept)."""
        self.weights_changed()

    def action_probabilities(self, batch: ActBatch) -> np.ndarray:
        """The policy's action distribution at each row, as it plays: exact
        (`response_action_probabilities`) when responses are opened with "[" and retries sample the
        same prompt again, else sampled (a retry told why reads its failed response)."""
        if not self.first_answer or (self.play.invalid.feedback and self.play.invalid.retries):
            return sampled_action_probabilities(self, batch)
        probs = np.zeros(np.shape(batch.mask), dtype=np.float64)
        for i in range(len(probs)):
            probs[i] = played_distribution(*response_action_probabilities(self, batch.obs[i], int(batch.seats[i]),
                                                                          np.asarray(batch.mask[i], dtype=bool)),
                                           np.asarray(batch.mask[i], dtype=bool), self.play.invalid.retries)
        return probs

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t >= 0 and t != self.stop_token], skip_special_tokens=True)

    def response_text(self, tokens: Sequence[int]) -> str:
        """The whole response as the parser reads it: the prefilled opening, then the tokens."""
        return self.play.prompt.response_prefix + self.decode(tokens)

    def parse(self, text: str, obs: np.ndarray, seat: int, mask: np.ndarray) -> ParsedResponse:
        """What a response means: the first bracketed answer when the response was opened with
        "[", else the last (after the LM's reasoning)."""
        return parse_response(self.view, text, obs, seat, mask, last=not self.first_answer, pattern=self.pattern)

    def move_text(self, response: str) -> str:
        """The move a response plays in a free-text game, as the game reads it: the response itself,
        or with `think`, what follows the reasoning (else its last answer, in brackets as
        TextArena's moves are); the reasoning itself is never said to the opponent."""
        prompt = self.play.prompt
        if not prompt.think:
            return response.strip()
        if prompt.reasoning_end and prompt.reasoning_end in response:
            return response.rsplit(prompt.reasoning_end, 1)[1].strip()
        found = self.pattern.findall(response)
        return f"[{found[-1].strip()}]" if found else ""

    def _generate(self, prompts: list[list[int]], rng: np.random.Generator, greedy: bool):
        gen = self.generator.generate(prompts, self.play.max_new_tokens, rng, stop_token=self.stop_tokens,
                                      greedy=greedy, temperature=self.play.temperature, store=self.readings())
        return gen, [self.response_text(gen.row(i)) for i in range(len(prompts))]

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        self.activate()
        obs, mask, seats = np.asarray(batch.obs), np.asarray(batch.mask, dtype=bool), np.asarray(batch.seats)
        n, width = len(mask), self.play.max_new_tokens
        prompts = [self.encode(obs[i], int(seats[i]), mask[i]) for i in range(n)]
        gen, texts = self._generate(prompts, rng, greedy)
        all_texts = [[t] for t in texts]
        attempts = np.ones(n, dtype=np.int64)
        free = (np.array([is_free_text(self.view, obs[i], mask[i]) for i in range(n)], dtype=bool) if self.mixed
                else np.full(n, self.free_text))
        parsed = [self.parse(texts[i], obs[i], int(seats[i]), mask[i]) for i in range(n)]
        # In a free-text game the game judges the move (and applies its own rule to an invalid one):
        # the row plays its text as it is. Listed answers are parsed, retried, then fall back.
        moves = tuple(self.move_text(t) if f else None for t, f in zip(texts, free.tolist())) if free.any() else ()
        actions = np.array([0 if free[i] else -1 if p.action is None else p.action for i, p in enumerate(parsed)],
                           dtype=np.int64)
        if not free.all():
            last, last_parsed = list(texts), list(parsed)
            for _ in range(self.play.invalid.retries):
                failed = np.flatnonzero(actions < 0)
                if len(failed) == 0:
                    break
                if self.play.invalid.feedback:
                    retry_prompts = [self.encode.retry(obs[i], int(seats[i]), mask[i], last[i],
                                                       last_parsed[i].problem) for i in failed.tolist()]
                else:
                    retry_prompts = [prompts[i] for i in failed.tolist()]
                _, retry_texts = self._generate(retry_prompts, rng, greedy=False)
                attempts[failed] += 1
                for i, text in zip(failed.tolist(), retry_texts):
                    all_texts[i].append(text)
                    last[i] = text
                    last_parsed[i] = self.parse(text, obs[i], int(seats[i]), mask[i])
                    actions[i] = -1 if last_parsed[i].action is None else last_parsed[i].action
        fallback = actions < 0
        if fallback.any():
            # under `forfeit` the action is not part of the match (the runner ends it), but it is legal
            actions[fallback] = sample_legal_uniform(mask[fallback], rng)
        steps = np.arange(width)[None, :] < gen.lengths[:, None]
        responses = np.where(steps, gen.tokens, -1)
        token_log_probs = np.where(steps, gen.log_probs, 0.0).astype(np.float32)
        self.last_turns = TextTurns(tuple(texts), tuple(parsed), attempts, fallback,
                                    tuple(tuple(t) for t in all_texts), moves)
        self.counts["turns"] += n
        self.counts["first_valid"] += sum(p.action is not None for p in parsed)
        self.counts["fallback"] += int(fallback.sum())
        # The behaviour log-prob of a turn is its first response's; values: the value head at the
        # response's first token (the state the turn was decided in).
        return ActOutput(actions, token_log_probs.sum(axis=1).astype(np.float32), gen.values[:, 0].copy(),
                         responses.astype(np.int64), token_log_probs,
                         forfeits=fallback.copy() if self.play.invalid.forfeit and not free.all() else None,
                         texts=list(moves) if moves else None,
                         said=list(texts) if self.play.prompt.think else None,
                         invalid_answers=(attempts - 1 + fallback).astype(np.int64))


def text_policy_from_snapshot(path: Any, expect_game: str | None = None, base: Any | None = None) -> TextLMPolicy:
    """The policy of an "lm_adapter" snapshot, acting on this process's shared base with the
    snapshot's adapters and its recorded way of playing (`TextPlayConfig`)."""
    from ludus.agents.lm.pretrained import shared_base, trained_state
    from ludus.agents.lm.snapshots import read_adapter_snapshot
    from ludus.agents.snapshot import SnapshotError
    from ludus.games.text import text_view

    record = read_adapter_snapshot(path, base, expect_game)
    if record.play is None:
        raise SnapshotError(f"snapshot {record.ref.path} records no way of playing text games (no 'play' entry)")
    play = snapshot_play(record)  # before the base is loaded: `arena submit` refuses it in seconds
    lm = shared_base(record.base)
    expected = {k: tuple(v.shape) for k, v in trained_state(lm.model).items()}
    if {k: tuple(v.shape) for k, v in record.tensors.items()} != expected:
        raise SnapshotError(f"snapshot {record.ref.path}: adapter tensors do not fit the base's adapters")
    # a snapshot of a mix playing one of its games reads that game's own view (games/mix.py)
    view = text_view(expect_game or record.manifest.game_id)
    return TextLMPolicy(lm.model, lm.tokenizer, view, play, adapters=record.tensors)


def snapshot_play(record: Any) -> TextPlayConfig:
    """The play settings an "lm_adapter" snapshot records (`ludus.agents.lm.snapshots.AdapterSnapshotRecord`),
    validated (`TextPlayConfig.from_json`) against its base's context, or a one-line SnapshotError."""
    from ludus.agents.lm.pretrained import base_model_dir
    from ludus.agents.snapshot import SnapshotError

    try:
        return TextPlayConfig.from_json(record.play, context=base_context(base_model_dir(record.base.base)))
    except LMError as exc:
        raise SnapshotError(f"snapshot {record.ref.path} records play settings it cannot play with: {exc}; "
                            f"re-save it with valid text_lm.play settings") from None


def base_context(directory: Any) -> int | None:
    """The longest sequence (tokens) the base saved in `directory` reads, from its config.json
    (`max_position_embeddings`, GPT-2's `n_positions`), without loading it; None when it names none."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def sampled_action_probabilities(policy: TextLMPolicy, batch: ActBatch, samples: int = 512, seed: int = 0) -> np.ndarray:
    """[N, A] action distribution of a text policy AS IT PLAYS (first response, retries and the
    random fallback included), estimated from `samples` responses per row: a response is text, so
    the probability of an action is the mass of every response that parses to it, which no finite
    enumeration gives. Each probability's standard error is at most 0.5 / sqrt(samples)."""
    obs, mask, seats = np.asarray(batch.obs), np.asarray(batch.mask, dtype=bool), np.asarray(batch.seats)
    probs = np.zeros(mask.shape, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for i in range(len(mask)):
        repeated = ActBatch(np.repeat(obs[i: i + 1], samples, axis=0), np.repeat(mask[i: i + 1], samples, axis=0),
                            np.full(samples, seats[i]))
        actions = policy.act(repeated, rng).actions
        probs[i] = np.bincount(actions, minlength=mask.shape[1])[: mask.shape[1]] / samples
    return probs


def played_distribution(response_probs: np.ndarray, invalid: float, mask: np.ndarray, retries: int) -> np.ndarray:
    """How a turn is played from one response's action distribution: a response that counts is
    played, an invalid one is retried up to `retries` times, then a uniformly random legal action:
    P(a) = p(a) (1 + q + ... + q^retries) + q^(retries+1) / |legal|."""
    q = min(max(invalid, 0.0), 1.0)
    tries = sum(q ** k for k in range(retries + 1))
    return response_probs * tries + (q ** (retries + 1)) * mask / mask.sum()


def _answer_tokens(tokenizer: Any, answers: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Ids and texts of the tokens a response opened with "[" can contain on its way to an answer:
    pieces of an answer (case and surrounding spaces ignored), and the tokens that close it."""
    key = tuple(sorted(answers))
    cache = tokenizer.__dict__.setdefault("_ludus_answer_tokens", {})
    if key not in cache:
        texts = token_texts(tokenizer)
        words = [a.lower() for a in answers]
        ids = sorted(i for i, t in texts.items() if "]" in t or (t.strip() and any(t.strip().lower() in w for w in words)))
        cache[key] = (np.array(ids, dtype=np.int64), [texts[i] for i in ids])
    return cache[key]


def answer_start_tokens(tokenizer: Any, answers: Mapping[str, int]) -> tuple[np.ndarray, ...]:
    """For each legal action (in increasing id order), the ids of the tokens a response opened with
    "[" can begin with on its way to naming that action and no other: a token whose text (case and
    spaces ignored) is a non-empty prefix of answers of that action only, or closes one of them
    ("bet]"). The first-token mass of each group is the LM's answer distribution at that token,
    which the learner's answer-entropy bonus reads (agents/lm/text_ppo.py)."""
    key = tuple(sorted(answers.items()))
    cache = tokenizer.__dict__.setdefault("_ludus_answer_start_tokens", {})
    if key not in cache:
        words = {normal_answer(a): action for a, action in answers.items()}
        groups: dict[int, list[int]] = {action: [] for action in sorted(set(words.values()))}
        opening, closing = _answer_start_index(tokenizer)
        # A token that closes an answer names the action of its core; any other token names the
        # actions of the answers its core begins. Every such core is a non-empty prefix of an
        # answer, so the answers' prefixes are looked up instead of the whole vocabulary scanned
        # (a legal set costs microseconds, not a pass over ~49k tokens per position).
        for word, action in words.items():
            groups[action] += closing.get(word, [])
        for core in {w[:n] for w in words for n in range(1, len(w) + 1)}:
            actions = {action for w, action in words.items() if w.startswith(core)}
            if len(actions) == 1:
                groups[actions.pop()] += opening.get(core, [])
        cache[key] = tuple(np.array(sorted(ids), dtype=np.int64) for ids in groups.values())
    return cache[key]


def _answer_start_index(tokenizer: Any) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The vocabulary's tokens that may begin an answer, by their normalised core, once per
    tokenizer: (tokens without "]" by their text, tokens holding "]" by the text before it).
    Tokens holding "[" or a newline begin no answer."""
    index = tokenizer.__dict__.get("_ludus_answer_start_index")
    if index is None:
        opening: dict[str, list[int]] = {}
        closing: dict[str, list[int]] = {}
        for token, text in token_texts(tokenizer).items():
            if "[" in text or "\n" in text:
                continue
            if "]" in text:
                closing.setdefault(normal_answer(text[: text.index("]")]), []).append(token)
            else:
                opening.setdefault(normal_answer(text), []).append(token)
        index = tokenizer.__dict__["_ludus_answer_start_index"] = (opening, closing)
    return index


PROBABILITY_FLOOR = 1e-8
"""Response prefixes less likely than this are not expanded by `response_action_probabilities`."""


def response_action_probabilities(policy: TextLMPolicy, obs: np.ndarray, seat: int, mask: np.ndarray
                                  ) -> tuple[np.ndarray, float]:
    """Exact probability that one response (opened with "[", closed at the first token holding "]",
    at most max_new_tokens) names each legal action, and the rest: the invalid mass.

    Enumerates every token sequence that is still on its way to an answer (case and spaces
    ignored, as `ludus.games.text.parse_response` reads it), scoring the frontier in one batch per
    token: a few forward passes instead of hundreds of samples. Tokens outside
    `_answer_tokens` can only make a response invalid, so they are never expanded; nor are
    sequences less likely than `PROBABILITY_FLOOR` (together at most ~1e-5 of the mass, counted as
    invalid). Text is built from the tokens' own texts, which for the ASCII answers of games is
    the text the tokenizer decodes."""
    from ludus.agents.lm.prompt_cache import SharedPromptCache

    answers = dict(policy.view.answers(obs, seat, mask))
    candidates, candidate_texts = _answer_tokens(policy.tokenizer, list(answers))
    policy.activate()
    prompt = policy.encode(obs, seat, mask)
    probs = np.zeros(len(mask), dtype=np.float64)
    frontier: list[tuple[tuple[int, ...], str, float]] = [((), "", 1.0)]

    # activated adapters read the prompt's activation tokens and the response so far; the rest, the
    # base's reading, is read once for every step (the policy's store)
    activated = policy.model.activation_tokens
    with torch.inference_mode():
        for step in range(policy.play.max_new_tokens):
            if not frontier:
                break
            rows = [prompt + list(node) for node, _, _ in frontier]
            counts = [activated + len(node) for node, _, _ in frontier] if activated else None
            cache = SharedPromptCache(policy.model, rows, store=policy.readings() if activated else None,
                                      activated=counts)
            hidden = cache.prompt_hidden
            logits, _ = policy.model.heads(hidden)
            log_pi = torch.log_softmax(logits.float() / policy.play.temperature, dim=-1)[:, torch.from_numpy(candidates)]
            token_probs = log_pi.exp().double().numpy()
            grown = []
            last_step = step + 1 == policy.play.max_new_tokens
            for (node, node_text, mass), row in zip(frontier, token_probs):
                for k in np.flatnonzero(row * mass >= PROBABILITY_FLOOR).tolist():
                    token, p = int(candidates[k]), float(row[k])
                    text = node_text + candidate_texts[k]
                    if "]" in text:
                        inside = text[: text.index("]")]
                        if "[" not in inside and normal_answer(inside) in answers:
                            probs[answers[normal_answer(inside)]] += mass * p
                        continue
                    core = normal_answer(text)
                    if not last_step and core and any(w.startswith(core) for w in answers) and not text.endswith("\n"):
                        grown.append((node + (token,), text, mass * p))
            frontier = grown
    return probs, float(max(0.0, 1.0 - probs.sum()))
