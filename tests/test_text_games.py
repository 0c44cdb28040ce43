"""Pretrained LMs playing text games (games/text.py, agents/lm/text_policy.py, agents/lm/text_ppo.py,
league/learners/text_lm.py), on a tiny random-initialised Llama with SmolLM2's real tokenizer and chat
template (tests/conftest.py `tiny_bases`): every path runs in seconds; the real SmolLM2 runs in
`test_smollm2_league_two_updates`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ludus.agents.lm.model import LMError
from ludus.agents.lm.split_trunk import SplitTrunk, frozen_lower_layers
from ludus.agents.lm.pretrained import LoRAConfig, PretrainedLMConfig, adapter_disabled, load_pretrained_lm, trained_state
from ludus.agents.policy import ActBatch
from ludus.agents.lm.text_policy import (InvalidResponses, TextLMPolicy, TextPlayConfig, answer_start_tokens,
                                played_distribution, response_action_probabilities, sampled_action_probabilities)
from ludus.agents.lm.text_ppo import (TextPPOConfig, TextPPOLearner, TurnBatch, all_action_loss, answer_entropies,
                             answer_log_probs, answer_values, distinct_turns, prompt_advantages, read_responses,
                             response_log_probs, role_advantages)
from ludus.games import registry
from ludus.games.core import GameError
from ludus.games.text import TEXT_VIEWS, canonical_answer, check_text_view, parse_response, text_view

KUHN = "spiel:kuhn_poker"


def _positions(game_id: str, n: int) -> ActBatch:
    """n decision points of random play (seat to move, its observation and legal mask)."""
    obs, masks, seats = [], [], []
    for seed in range(n):
        game = registry.make(game_id)
        game.reset(seed)
        rng = np.random.default_rng(seed)
        for _ in range(seed % 3):
            seat = game.to_move()[0]
            game.step({seat: int(rng.choice(np.flatnonzero(game.legal_mask(seat))))})
            if game.is_terminal():
                game.reset(seed)
                break
        seat = game.to_move()[0]
        obs.append(game.observation(seat))
        masks.append(game.legal_mask(seat))
        seats.append(seat)
    return ActBatch(np.stack(obs), np.stack(masks), np.array(seats))


@pytest.fixture(scope="module")
def tiny_lm(tiny_bases):
    return load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=3)


def _policy(lm, game_id=KUHN, **play) -> TextLMPolicy:
    return TextLMPolicy(lm.model, lm.tokenizer, text_view(game_id), TextPlayConfig(**play))


def _played_turns(policy: TextLMPolicy, n: int):
    """n Kuhn positions played by `policy` (seeded): the batch, the act output, and each row's
    prompt and recorded (first) response as token tuples."""
    batch = _positions(KUHN, n)
    out = policy.act(batch, np.random.default_rng(0))
    lengths = (out.responses >= 0).sum(axis=1)
    prompts = tuple(tuple(policy.encode(batch.obs[i], int(batch.seats[i]), batch.mask[i])) for i in range(n))
    responses = tuple(tuple(out.responses[i, :lengths[i]].tolist()) for i in range(n))
    return batch, out, prompts, responses


# --------------------------------------------------------------------------------- the views


@pytest.mark.parametrize("game_id", sorted(TEXT_VIEWS))
def test_every_text_view_passes_its_checker(game_id):
    check_text_view(text_view(game_id), registry.make(game_id))


def test_kuhn_view_tells_the_seat_only_what_it_sees():
    game = registry.make(KUHN)
    game.reset(1)
    game.step({0: 1})  # player 0 bets
    view = text_view(KUHN)
    state = view.state(game.observation(1), 1, game.legal_mask(1))
    assert "Player 0 bets." in state and "[fold] [call]" in state
    other = view.state(game.observation(0), 0, np.zeros(2, bool))
    card_1 = state.split("Your card: ")[1].split(".")[0]
    assert card_1 not in other.split("So far")[0] or card_1 == other.split("Your card: ")[1].split(".")[0]


def test_parse_outcomes_are_named():
    game = registry.make(KUHN)
    game.reset(0)
    view, obs, mask = text_view(KUHN), game.observation(0), game.legal_mask(0)
    assert parse_response(view, "I think [Check]", obs, 0, mask).action == 0
    assert parse_response(view, "[bet] or rather [check]", obs, 0, mask).action == 0  # the last counts
    assert parse_response(view, "[bet] or rather [check]", obs, 0, mask, last=False).action == 1
    assert parse_response(view, "check", obs, 0, mask).problem == "no answer"
    assert parse_response(view, "[raise]", obs, 0, mask).problem == "unknown answer"
    facing = registry.make(KUHN)
    facing.reset(0)
    facing.step({0: 1})
    assert parse_response(view, "[check]", facing.observation(1), 1, facing.legal_mask(1)).problem == "unknown answer"
    ttt = registry.make("tic_tac_toe")
    ttt.reset(0)
    ttt.step({0: 4})
    board = text_view("tic_tac_toe")
    assert parse_response(board, "[4]", ttt.observation(1), 1, ttt.legal_mask(1)).problem == "illegal answer"
    assert canonical_answer(board, ttt.observation(1), 1, ttt.legal_mask(1), 0) == "[0]"


def test_a_game_without_a_text_view_is_a_one_line_error():
    with pytest.raises(GameError, match="no text view"):
        text_view("connect_three")


# --------------------------------------------------------------------------------- the policy


def test_text_policy_always_plays_a_legal_action_and_records_its_first_response(tiny_lm):
    batch = _positions("tic_tac_toe", 24)
    policy = _policy(tiny_lm, "tic_tac_toe", max_new_tokens=4, invalid=InvalidResponses(retries=1))
    out = policy.act(batch, np.random.default_rng(0))
    assert batch.mask[np.arange(24), out.actions].all()
    turns = policy.last_turns
    # a random tiny model rarely answers: every row retried once, then played a random legal move
    assert (turns.attempts[turns.fallback] == 2).all() and turns.fallback.any()
    lengths = (out.responses >= 0).sum(axis=1)
    assert (lengths >= 1).all() and (lengths <= 4).all()
    np.testing.assert_allclose(out.log_probs, out.response_log_probs.sum(axis=1), rtol=1e-6)
    for i in range(24):  # the recorded response is the first one, and the text it was parsed from
        assert policy.decode(out.responses[i, :lengths[i]].tolist()) == turns.texts[i][1:]


def test_text_policy_is_reproducible_from_its_seed(tiny_lm):
    batch = _positions(KUHN, 16)
    a = _policy(tiny_lm).act(batch, np.random.default_rng(7))
    b = _policy(tiny_lm).act(batch, np.random.default_rng(7))
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.responses, b.responses)


def test_distinct_prompts_are_read_once_with_the_same_tokens(tiny_lm):
    """Rows asking the same position share its KV cache: same tokens as reading each row alone."""
    from ludus.agents.lm.generation import LMPolicy

    policy = _policy(tiny_lm)
    batch = _positions(KUHN, 12)
    prompts = [policy.encode(batch.obs[i], int(batch.seats[i]), batch.mask[i]) for i in range(12)] * 3
    assert len({tuple(p) for p in prompts}) < len(prompts)
    generator = LMPolicy(tiny_lm.model, pad_id=0)
    for greedy in (True, False):
        shared = generator.generate(prompts, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, greedy=greedy)
        alone = generator.generate(prompts, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, greedy=greedy,
                                   reuse_prefix=False)
        np.testing.assert_array_equal(shared.tokens, alone.tokens)
        np.testing.assert_allclose(shared.log_probs, alone.log_probs, atol=1e-4)
    # prompts kept from an earlier call (a PromptStore) give the same tokens again
    from ludus.agents.lm.prompt_cache import PromptStore

    store = PromptStore()
    for _ in range(2):
        kept = generator.generate(prompts, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, store=store)
        np.testing.assert_array_equal(kept.tokens, alone.tokens)
    assert len(store.entries) == len({tuple(p) for p in prompts})
    # a store too small for the batch evicts (by bytes, oldest first) and still gives the same tokens
    one_entry = store.bytes / len(store.entries)
    small = PromptStore(capacity_mb=2.5 * one_entry / 2**20)
    for _ in range(2):
        kept = generator.generate(prompts, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, store=small)
        np.testing.assert_array_equal(kept.tokens, alone.tokens)
        assert len(small.entries) < len(store.entries) and small.bytes <= small.capacity_bytes


def test_a_later_turn_reads_only_what_it_adds_to_a_stored_prompt(tiny_lm):
    """The next turn of a negotiation repeats the rules, the items and what was said, then adds
    the new moves: with a store, only its tokens after the longest stored shared prefix are read
    (`PromptStore.longest_shared`), and it gives the tokens of reading it alone."""
    from ludus.agents.lm.generation import LMPolicy
    from ludus.agents.lm.prompt_cache import PromptStore

    policy = _policy(tiny_lm, "negotiation_turns")
    first, later = [], []
    for seed in range(6):
        game = registry.make("negotiation_turns")
        game.reset(seed)
        rng = np.random.default_rng(seed)
        prompts = []
        for _ in range(3):  # seat 0 speaks at turns 1 and 3
            seat = game.to_move()[0]
            mask = game.legal_mask(seat)
            prompts.append(policy.encode(game.observation(seat), seat, mask))
            game.step({seat: int(rng.choice(np.flatnonzero(mask)[1:]))})  # proposals: the game goes on
        first.append(prompts[0])
        later.append(prompts[2])
    generator = LMPolicy(tiny_lm.model, pad_id=0)
    read = []
    trunk = tiny_lm.model.trunk

    def counting_trunk(input_ids, *args, **kwargs):
        read.append(int(input_ids.numel()))
        return trunk(input_ids, *args, **kwargs)

    store = PromptStore()
    generator.generate(first, 1, np.random.default_rng(0), stop_token=policy.stop_tokens, store=store)
    stem = store.longest_shared(later[0])
    assert stem is not None and stem[0] > len(first[0]) // 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny_lm.model, "trunk", counting_trunk)
        kept = generator.generate(later, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, store=store)
        with_store = read[0]  # the prompts' read (the calls after it add the new tokens)
        read.clear()
        generator.generate(later, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, store=PromptStore())
        without = sum(read[:2])  # the common prefix, then each prompt's rest
    assert with_store < 0.7 * without
    alone = generator.generate(later, 6, np.random.default_rng(1), stop_token=policy.stop_tokens, reuse_prefix=False)
    np.testing.assert_array_equal(kept.tokens, alone.tokens)
    np.testing.assert_allclose(kept.log_probs, alone.log_probs, atol=1e-4)
    np.testing.assert_allclose(kept.values, alone.values, atol=1e-4)


@pytest.fixture(scope="module")
def activated_lm(tiny_bases):
    """Activated adapters (read from "assistant\n[" on), nonzero so that they matter."""
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LoRAConfig(activation_tokens=4)), seed=3)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    return lm


@pytest.mark.parametrize("activated", [False, True])
def test_exact_action_probabilities_match_sampling(tiny_lm, activated_lm, activated):
    """The enumerated response distribution agrees with 1200 samples of the policy as it plays
    (a probability's standard error is at most 0.015: 0.05 is over three of them)."""
    game = registry.make(KUHN)
    game.reset(2)
    obs, mask = game.observation(0), game.legal_mask(0)
    policy = _policy(activated_lm if activated else tiny_lm, max_new_tokens=3, temperature=1.0,
                     invalid=InvalidResponses(retries=1))
    probs, invalid = response_action_probabilities(policy, obs, 0, mask)
    played = played_distribution(probs, invalid, mask, retries=1)
    assert played.sum() == pytest.approx(1.0)
    sampled = sampled_action_probabilities(policy, ActBatch(obs[None], mask[None], np.zeros(1, int)), samples=1200)[0]
    np.testing.assert_allclose(sampled, played, atol=0.05)


# --------------------------------------------------------------------------------- the learner


def test_role_advantages_follow_spiral():
    returns = np.array([1.0, -1.0, 1.0, 1.0])
    roles = np.array([0, 0, 1, 1])
    advantages, baselines = role_advantages(returns, roles, np.array([0.5, -0.5]), decay=0.9)
    np.testing.assert_allclose(advantages, [0.5, -1.5, 1.5, 1.5])
    np.testing.assert_allclose(baselines, [0.9 * 0.5 + 0.1 * 0.0, 0.9 * -0.5 + 0.1 * 1.0])


def test_prompt_baseline_is_the_mean_of_the_other_turns_with_the_same_prompt():
    prompts = [(1, 2), (1, 2), (1, 2), (3,), (1, 2)]
    returns = np.array([2.0, -2.0, -1.0, 1.0, 2.0])
    advantages = prompt_advantages(returns, prompts, fallback=np.full(5, 0.25))
    np.testing.assert_allclose(advantages, [2 - (-1 / 3), -2 - 1.0, -1 - (2 / 3), 1 - 0.25, 2 - (-1 / 3)], rtol=1e-6)
    assert abs(float(advantages[[0, 1, 2, 4]].sum())) < 1e-5  # one prompt's advantages sum to 0


def test_training_reads_the_behaviour_log_probs_back_exactly(tiny_lm):
    """On-policy, the learner's log-probs of the recorded responses are the generator's (ratio 1)."""
    _, out, prompts, responses = _played_turns(_policy(tiny_lm, max_new_tokens=5), 20)
    with torch.no_grad():
        reading = response_log_probs(tiny_lm.model, prompts, responses, temperature=1.0)
        log_probs, mask = reading.log_probs, reading.mask
    np.testing.assert_allclose(log_probs[mask].numpy(), out.response_log_probs[out.responses >= 0], atol=1e-4)


def test_repeated_turns_are_read_once_with_the_same_log_probs_and_gradients(tiny_lm):
    """Kuhn batches repeat (prompt, response) pairs: reading each pair once and indexing it back
    to its rows gives every row's log-probs and the same gradient as reading every row."""
    _, _, prompts, responses = _played_turns(_policy(tiny_lm, max_new_tokens=3), 24)
    prompts, responses = prompts + prompts[:12], responses + responses[:12]  # every one of 12 rows twice
    weights = torch.linspace(-1.0, 1.0, len(prompts))[:, None]
    trained = [p for p in tiny_lm.model.parameters() if p.requires_grad]

    def gradient(read_once: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        tiny_lm.model.zero_grad()
        if read_once:
            unique_prompts, unique_responses, pair_of_row = distinct_turns(prompts, responses)
            assert len(unique_prompts) <= 24 < len(prompts)
            log_probs = response_log_probs(tiny_lm.model, unique_prompts, unique_responses, 1.0).log_probs[pair_of_row]
        else:
            log_probs = response_log_probs(tiny_lm.model, prompts, responses, 1.0).log_probs
        (weights * log_probs).sum().backward()
        # (the value head is trainable too, but no log-prob reads it)
        return log_probs.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in trained]

    each, each_grads = gradient(read_once=False)
    once, once_grads = gradient(read_once=True)
    torch.testing.assert_close(once, each, atol=1e-5, rtol=1e-5)
    assert sum(float(g.abs().sum()) for g in each_grads) > 0
    for a, b in zip(once_grads, each_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_update_moves_only_the_adapters_towards_rewarded_answers(tiny_bases, dtype):
    """Also on a bfloat16 base, whose adapters and value head stay float32."""
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), dtype=dtype), seed=0)
    trained = [p for p in lm.model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert lm.model.lm.get_output_embeddings().weight.dtype == getattr(torch, dtype)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    batch, out, prompts, responses = _played_turns(_policy(lm, max_new_tokens=2), 32)
    first = out.responses[:, 0]
    target = int(np.bincount(first).argmax())
    turns = TurnBatch(prompts, responses, tuple(out.response_log_probs[i, :len(responses[i])] for i in range(32)),
                      np.where(first == target, 1.0, -1.0), batch.seats.astype(np.int64), out.values.astype(np.float64))
    learner = TextPPOLearner(lm.model, TextPPOConfig(learning_rate=1e-2, minibatch_size=32, micro_batch_size=8,
                                                     epochs=4), temperature=1.0, num_roles=2, seed=0)
    prompt = list(turns.prompts[int(np.flatnonzero(first == target)[0])])

    def target_log_prob():
        with torch.no_grad():
            return float(response_log_probs(lm.model, [prompt], [[target]], 1.0).log_probs[0, 0])

    start = target_log_prob()
    stats = learner.update(turns)
    assert target_log_prob() > start + 0.02  # PPO clips each update to a ratio of 1 + clip_coef
    assert stats["kl_to_base"] >= 0 and np.isfinite(stats["policy_loss"]) and stats["value_loss"] > 0
    after = lm.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k or k.startswith("value_head.") for k in changed)
    assert any(k.startswith("value_head.") for k in changed)  # the value baseline learns
    assert stats["value_loss_after_fit"] < 0.5 * stats["value_loss"]  # its own steps fit the returns
    with adapter_disabled(lm.model):  # the base itself never moved
        assert all(torch.equal(before[k], lm.model.state_dict()[k]) for k in before
                   if "lora_" not in k and not k.startswith("value_head."))


def test_with_adapters_in_the_top_layers_the_lower_layers_are_read_once_for_the_same_update(tiny_bases):
    """`lora.layers`: below the adapters the KL reference and the policy are the same function, so
    the learner reads those layers once per micro-batch (agents/lm/split_trunk.py `SplitTrunk`); the readings
    and the update equal the uncut model's."""
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LoRAConfig(rank=4, alpha=8.0, layers=1)),
                            seed=0)
    with torch.no_grad():  # adapters away from B = 0: the policy differs from the reference
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(1))
    start = {k: v.clone() for k, v in trained_state(lm.model).items()}
    batch, out, prompts, responses = _played_turns(_policy(lm, max_new_tokens=2), 24)
    assert frozen_lower_layers(lm.model) == 1  # the tiny base: layers 0 and 1
    trunk = SplitTrunk(lm.model, 1)
    with torch.no_grad():
        read_responses(trunk.below(), prompts, responses)
        policy = response_log_probs(lm.model, prompts, responses, 1.0).log_probs
        torch.testing.assert_close(response_log_probs(trunk.above(), prompts, responses, 1.0).log_probs, policy)
        with adapter_disabled(lm.model):
            reference = response_log_probs(lm.model, prompts, responses, 1.0).log_probs
            torch.testing.assert_close(response_log_probs(trunk.above(), prompts, responses, 1.0).log_probs, reference)
    assert not torch.allclose(policy, reference)

    first = out.responses[:, 0]
    turns = TurnBatch(prompts, responses, tuple(out.response_log_probs[i, :len(responses[i])] for i in range(24)),
                      np.where(first == np.bincount(first).argmax(), 1.0, -1.0), batch.seats.astype(np.int64),
                      out.values.astype(np.float64))

    def update(cut: bool):
        lm.model.load_state_dict(start, strict=False)
        learner = TextPPOLearner(lm.model, TextPPOConfig(learning_rate=1e-2, minibatch_size=24, micro_batch_size=8),
                                 temperature=1.0, num_roles=2, seed=0)
        assert learner.frozen_layers == 1
        learner.frozen_layers = learner.frozen_layers if cut else 0
        stats = learner.update(turns)
        return stats, {k: v.clone() for k, v in trained_state(lm.model).items()}

    cut_stats, cut_state = update(cut=True)
    full_stats, full_state = update(cut=False)
    assert cut_stats["kl_to_base"] > 0
    assert cut_stats["kl_to_base"] == pytest.approx(full_stats["kl_to_base"], rel=1e-5)
    assert any(not torch.equal(cut_state[k], start[k]) for k in start if "lora_" in k)
    for k in start:
        torch.testing.assert_close(cut_state[k], full_state[k], atol=1e-6, rtol=1e-5)
    # adapters in every layer: nothing below them to share
    every = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=0)
    assert frozen_lower_layers(every.model) == 0
    assert TextPPOLearner(every.model, TextPPOConfig(), 1.0, 2, 0).frozen_layers == 0
    with pytest.raises(LMError, match="cut between"):
        SplitTrunk(lm.model, 2)


def test_answer_start_tokens_group_the_vocabulary_by_the_answer_they_begin(tiny_lm):
    texts = {i: tiny_lm.tokenizer.decode([i]) for i in range(len(tiny_lm.tokenizer))}
    fold, call = answer_start_tokens(tiny_lm.tokenizer, {"fold": 0, "call": 1})
    assert {" fold", "fold", "f"} <= {texts[i] for i in fold}
    assert {" call", "call", "ca"} <= {texts[i] for i in call}
    # "c" begins "call" only here, but "check" too when those are the answers: then it is nobody's
    assert "c" in {texts[i] for i in call}
    check, call_or_bet = answer_start_tokens(tiny_lm.tokenizer, {"check": 0, "call": 1})
    assert "c" not in {texts[i] for i in check} | {texts[i] for i in call_or_bet}
    assert not {texts[i] for i in fold} & {"[", "]", "x"}


def test_the_answer_entropy_bonus_spreads_the_answers(tiny_bases):
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=1)
    batch, out, prompts, responses = _played_turns(_policy(lm, max_new_tokens=2), 24)
    view = text_view(KUHN)
    groups = tuple(answer_start_tokens(lm.tokenizer, view.answers(batch.obs[i], int(batch.seats[i]), batch.mask[i]))
                   for i in range(24))
    # returns equal to the behaviour values: zero advantages, so only the bonus moves the adapters
    turns = TurnBatch(prompts, responses, tuple(out.response_log_probs[i, :len(responses[i])] for i in range(24)),
                      out.values.astype(np.float64), batch.seats.astype(np.int64), out.values.astype(np.float64),
                      groups)

    def answer_entropy() -> float:
        with torch.no_grad():
            return float(answer_entropies(response_log_probs(lm.model, prompts, responses, 1.0).first_log_pi,
                                          groups).mean())

    start = answer_entropy()
    config = TextPPOConfig(learning_rate=1e-2, kl_coef=0.0, answer_entropy_coef=1.0, minibatch_size=24,
                           micro_batch_size=12, epochs=3)
    stats = TextPPOLearner(lm.model, config, temperature=1.0, num_roles=2, seed=0).update(turns)
    # every row has two legal answers: the bonus closes most of the gap to ln 2 (random init starts near it)
    assert stats["answer_entropy"] > 0 and np.log(2) - answer_entropy() < 0.5 * (np.log(2) - start)
    with pytest.raises(ValueError, match="answer tokens"):
        TextPPOLearner(lm.model, config, 1.0, 2, 0).update(dataclasses.replace(turns, answer_tokens=None))


def test_answer_values_are_each_answers_mean_return_at_a_prompt():
    prompts = [(1,), (1,), (1,), (2,), (2,), (3,), (1,)]
    answers = np.array([0, 1, 1, 0, 0, 1, -1])
    returns = np.array([-1.0, 2.0, 0.0, 1.0, 3.0, 5.0, 9.0])
    values = answer_values(prompts, answers, returns, [2] * 7)
    for i in (0, 1, 2):
        np.testing.assert_allclose(values[i], [-1.0, 1.0])  # the invalid turn (-1) counts for no answer
    # one answer only (prompt 2), a prompt asked once, an invalid response: the sampled surrogate trains them
    assert values[3] is None and values[4] is None and values[5] is None and values[6] is None
    three = answer_values([(1,), (1,)], np.array([0, 2]), np.array([1.0, -1.0]), [3, 3])[0]
    np.testing.assert_allclose(three, [1.0, np.nan, -1.0])


def test_the_all_action_loss_follows_the_exact_expected_return():
    """Its gradient is the gradient of -sum_a q(a) Q(a), q the renormalised answer mass; an answer
    without an estimate counts as the average of the others (so nothing pushes it up or down)."""
    torch.manual_seed(0)
    logits = torch.randn(40, requires_grad=True)
    groups = (np.array([3, 7]), np.array([10]), np.array([], dtype=np.int64), np.array([20, 21, 22]))
    for values in (np.array([1.0, -2.0, 0.5, 0.25]), np.array([1.0, np.nan, 0.5, -0.5])):
        (grad,) = torch.autograd.grad(all_action_loss(torch.log_softmax(logits, 0), groups, values), logits)
        log_pi = torch.log_softmax(logits, 0)
        mass = torch.stack([torch.logsumexp(log_pi[torch.from_numpy(groups[k])], 0) for k in (0, 1, 3)])
        q = torch.softmax(mass, 0)
        q_values = torch.tensor(values[[0, 1, 3]]).float()
        known = ~torch.isnan(q_values)
        average = (q.detach() * torch.nan_to_num(q_values))[known].sum() / q.detach()[known].sum()
        (exact,) = torch.autograd.grad(-(q * torch.where(known, q_values, average)).sum(), logits)
        torch.testing.assert_close(grad, exact)


def test_all_actions_moves_a_position_towards_its_better_answer(tiny_bases):
    """One position asked twelve times with both answers given: one update raises the answer whose
    turns scored higher, whichever of the two it is."""
    for better in (0, 1):
        lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=2)
        batch, out, prompts, responses = _played_turns(_policy(lm, max_new_tokens=2), 1)
        groups = answer_start_tokens(lm.tokenizer, text_view(KUHN).answers(batch.obs[0], int(batch.seats[0]),
                                                                           batch.mask[0]))
        answers = np.array([0, 1] * 6)
        turns = TurnBatch(prompts * 12, responses * 12, (out.response_log_probs[0, :len(responses[0])],) * 12,
                          np.where(answers == better, 1.0, -1.0), np.repeat(batch.seats, 12).astype(np.int64),
                          np.zeros(12), (groups,) * 12, answers)

        def better_answer_probability() -> float:
            with torch.no_grad():
                log_pi = response_log_probs(lm.model, prompts, responses, 1.0).first_log_pi[0]
            log_q, present = answer_log_probs(log_pi, groups)
            return float(log_q[present.index(better)].exp())

        start = better_answer_probability()
        config = TextPPOConfig(learning_rate=3e-2, kl_coef=0.0, all_actions=True, minibatch_size=12,
                               micro_batch_size=6, epochs=4)
        stats = TextPPOLearner(lm.model, config, temperature=1.0, num_roles=2, seed=0).update(turns)
        assert stats["all_action_turns"] == 1.0
        assert better_answer_probability() > start + 0.02
    with pytest.raises(ValueError, match="answers"):
        TextPPOLearner(lm.model, config, 1.0, 2, 0).update(dataclasses.replace(turns, answers=None))


# --------------------------------------------------------------------------------- the league


def _league_config(base: Path, *extra: str):
    from ludus.league.api import load_config

    # turn-level PPO on Kuhn poker's text (the preset itself trains by MMD: tests/test_text_mmd.py)
    return load_config("llm_kuhn_poker", ["learner=text_ppo", f"text_lm.model.base={base}", "iterations=2",
                                          "matches_per_iteration=24",
                                          "num_envs=24", "log.wandb=disabled", "log.tensorboard=false",
                                          "log.progress=false", "text_lm.ppo.minibatch_size=64",
                                          "text_lm.ppo.micro_batch_size=32", *extra])


@pytest.mark.parametrize("activation_tokens, dtype", [(0, "float32"), (4, "float32"), (0, "bfloat16")])
def test_llm_league_trains_rates_and_resumes_exactly(tiny_bases, tmp_path, activation_tokens, dtype):
    """Also with activated adapters, whose runners keep the base's prompt readings across weights,
    and on a bfloat16 base."""
    from ludus.league.api import League
    from ludus.league.check import resumed_fingerprint, run_fingerprint

    config = _league_config(tiny_bases[0], "snapshot_every_steps=20",
                            f"text_lm.model.lora.activation_tokens={activation_tokens}", f"text_lm.model.dtype={dtype}")
    whole = League.create(config, tmp_path / "whole")
    whole.run()
    members = {m.player_id: m for m in whole.population.members()}
    assert {"anchor:base", "anchor:random", "main@0"} <= set(members)
    assert members["anchor:base"].snapshot_id == members["main@0"].snapshot_id  # the untrained base
    assert any(p.startswith("main@") and p != "main@0" for p in members)
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    learned = [m for m in metrics if "losses/main/valid_response_rate" in m]
    assert len(learned) == 2 and all(0 <= m["losses/main/valid_response_rate"] <= 1 for m in learned)
    whole.close()
    # stopped at the first iteration boundary, as a kill would leave it, and resumed
    assert run_fingerprint(tmp_path / "whole") == resumed_fingerprint(config, tmp_path / "half")


def test_llm_turns_that_never_answer_forfeit_when_configured(tiny_bases, tmp_path):
    from ludus.league.api import League, replay_match
    from ludus.league.records.ledger import Store

    # the tiny random model rarely names a legal action: with no retries most of its turns fail
    config = _league_config(tiny_bases[0], "iterations=1", "text_lm.play.invalid.forfeit=true",
                            "text_lm.play.invalid.retries=0")
    league = League.create(config, tmp_path / "run")
    league.run()
    league.close()
    with Store.open(tmp_path / "run", mode="read") as store:
        matches = [recorded.result for recorded in store.iter_matches()]
    forfeits = [(m, s) for m in matches for s in m.seats if s.status != "ok"]
    assert forfeits, "no LM turn forfeited"
    for match, seat in forfeits:
        assert seat.status == "invalid" and seat.player_id.startswith(("main", "anchor:base"))
        assert seat.episode_return == -2.0 and seat.outcome == 0.0  # Kuhn's worst return: a loss
    replay = replay_match(tmp_path / "run", forfeits[0][0].match_id)
    assert replay.matches and "forfeits" in replay.transcript


def test_async_llm_league_drops_stale_turns(tiny_bases, tmp_path):
    from ludus.league.api import League

    config = _league_config(tiny_bases[0], "pipeline_depth=2", "max_policy_lag=0", "iterations=3")
    league = League.create(config, tmp_path / "run")
    summaries = league.run()
    league.close()
    # in async mode the next iteration's games are played by the weights before this update: with
    # max_policy_lag 0 those turns are dropped, never trained on
    assert sum(s.dropped_transitions for s in summaries) > 0
    assert league.learners["main"].state.dropped_stale > 0


def test_lm_snapshot_plays_anywhere_its_base_is_and_nowhere_else(tiny_bases, tmp_path):
    from ludus.agents.lm.snapshots import save_adapter_snapshot
    from ludus.agents.snapshot import SnapshotError, policy_from_snapshot

    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=1)
    play = TextPlayConfig(max_new_tokens=3, temperature=0.5)
    save_adapter_snapshot(lm, registry.spec(KUHN), tmp_path / "snap", play=play.to_json())
    policy = policy_from_snapshot(tmp_path / "snap", expect_game=KUHN, lm_base=PretrainedLMConfig(base=str(tiny_bases[0])))
    assert isinstance(policy, TextLMPolicy) and policy.play == play
    for name, tensor in trained_state(lm.model).items():
        assert torch.equal(policy.adapters[name], tensor)
    with pytest.raises(SnapshotError, match="trained on base"):
        policy_from_snapshot(tmp_path / "snap", lm_base=PretrainedLMConfig(base=str(tiny_bases[1])))
    with pytest.raises(SnapshotError, match="local base model"):
        policy_from_snapshot(tmp_path / "snap")


def test_a_person_plays_kuhn_against_an_lm_snapshot_seeing_only_their_own_card(tiny_bases, tmp_path):
    from ludus.agents.play import play_terminal
    from ludus.agents.lm.snapshots import save_adapter_snapshot
    from ludus.agents.snapshot import policy_from_snapshot

    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=1)
    save_adapter_snapshot(lm, registry.spec(KUHN), tmp_path / "snap", play=TextPlayConfig(max_new_tokens=3).to_json())
    policy = policy_from_snapshot(tmp_path / "snap", expect_game=KUHN,
                                  lm_base=PretrainedLMConfig(base=str(tiny_bases[0])))
    lines, out = iter(["raise", "bet", "[call]"]), []

    def person(prompt: str) -> str:
        out.append(prompt)
        return next(lines)

    # seed 3 deals the Jack to seat 0 (the person) and the Queen to the LM
    result = play_terminal(KUHN, policy, human_seat=0, seed=3, input_fn=person,
                           print_fn=lambda *parts: out.append(" ".join(map(str, parts))))
    text = "\n".join(out)
    assert result.finished and len(result.history) == 2  # bet, then the LM called or folded
    assert "Your card: Jack." in text and "Queen." not in text.split("Game over")[0]
    assert "'raise' is not a move; type one of: check bet" in text
    assert 'seat 1 plays [' in text and '(it wrote "[' in text


def test_lm_exploitability_on_kuhn(tiny_lm):
    from ludus.agents.solvers.exploitability import exploitability

    policy = _policy(tiny_lm, max_new_tokens=3)
    value = exploitability(KUHN, policy)
    # a random tiny model almost never answers: it plays the random fallback, exploitability ~0.458
    assert 0.3 < value < 0.6


def test_text_learner_config_errors_are_one_line(tiny_bases):
    from ludus.league.api import load_config
    from ludus.league.configio import ConfigError

    with pytest.raises(ConfigError, match="text view"):
        load_config("llm_kuhn_poker", ["game=connect_three"])
    with pytest.raises(ConfigError, match="needs an LM learner: text_ppo, text_mmd, text_exit"):
        load_config("tic_tac_toe", ["anchors=[base]"])
    with pytest.raises(ConfigError, match="temperature"):
        load_config("llm_kuhn_poker", ["text_lm.play.temperature=0"])
    with pytest.raises(ConfigError, match="response_prefix"):
        load_config("llm_kuhn_poker", ["text_lm.play.prompt.think=true"])


@pytest.mark.slow  # ~30 s each: CI's second pass, with the learning checks
@pytest.mark.parametrize("learner", ["text_mmd", "text_ppo"])
def test_smollm2_league_two_updates(smollm2_dir, tmp_path, learner):
    """The real SmolLM2-135M-Instruct: a league with two learner updates, rated (the preset's MMD
    learner and turn-level PPO)."""
    from ludus.league.api import League, load_config

    steps = ["text_lm.mmd.distill_steps=2"] if learner == "text_mmd" else []  # the preset's 8: ~35 s per update
    config = load_config("llm_kuhn_poker", [f"learner={learner}", "iterations=2", "matches_per_iteration=16",
                                            "num_envs=16", "log.wandb=disabled", "log.tensorboard=false",
                                            "log.progress=false", *steps])
    league = League.create(config, tmp_path / "run")
    league.run()
    assert league.learners["main"].version == 2
    assert "anchor:base" in league.ratings
    league.close()


@pytest.mark.parametrize("baseline, all_actions, activation_tokens",
                         [("value", False, 0), ("prompt", False, 0), ("value", True, 0), ("rae", False, 4)])
def test_text_learner_passes_the_learner_checker(tiny_bases, baseline, all_actions, activation_tokens):
    """Save, restore into a fresh learner, same second batch: identical state and statistics."""
    from ludus.league.check import check_learner

    report = check_learner(_league_config(tiny_bases[0], "text_lm.ppo.learning_rate=2e-4",
                                          f"text_lm.ppo.baseline={baseline}", "text_lm.ppo.answer_entropy_coef=0.05",
                                          f"text_lm.ppo.all_actions={str(all_actions).lower()}",
                                          f"text_lm.model.lora.activation_tokens={activation_tokens}"))
    assert report.learner == "text_ppo" and report.tensors > 0 and report.rows > 0


def test_exponent_numbers_on_the_command_line_are_numbers():
    from ludus.league.api import load_config

    assert load_config("llm_kuhn_poker", ["learner=text_ppo", "text_lm.ppo.learning_rate=2e-4"]
                       ).text_lm.ppo.learning_rate == 2e-4


@pytest.mark.parametrize("game_id", [KUHN, "tic_tac_toe"])
def test_text_policy_passes_the_policy_checker(tiny_lm, game_id):
    from ludus.agents.check import check_policy

    check_policy(_policy(tiny_lm, game_id, max_new_tokens=3), game_id, num_games=2)


def test_an_lm_league_plays_a_textarena_game(tiny_bases, tmp_path):
    """TextArena's tic-tac-toe (games/adapters/textarena.py) in the LM league: the LM reads TextArena's own
    text, the random anchor plays the same game through the legal mask, and every recorded match
    replays to its stored result."""
    from ludus.league.api import League, replay_match
    from ludus.league.records.ledger import Store

    config = _league_config(tiny_bases[0], "game=ta:TicTacToe-v0", "iterations=1", "matches_per_iteration=12",
                            "num_envs=12")
    league = League.create(config, tmp_path / "run")
    league.run()
    assert league.learners["main"].version == 1
    league.close()
    with Store.open(tmp_path / "run", mode="read") as store:
        matches = [recorded.result for recorded in store.iter_matches()]
    assert len(matches) >= 12 and {s.player_id for m in matches for s in m.seats} >= {"main@0", "anchor:random"}
    for match in matches[:4]:
        assert replay_match(tmp_path / "run", match.match_id).matches
