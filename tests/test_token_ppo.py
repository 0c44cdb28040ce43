"""Token-level PPO: rewards, GAE over own tokens, loss masking, KL control, and small updates.

The reward/GAE checks run on literal arrays against a computation done by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ludus.agents.lm.generation import LMPolicy
from ludus.agents.lm.model import TinyLMConfig, build_tiny_lm
from ludus.agents.threads import torch_threads
from ludus.agents.rl.token_ppo import (
    AdaptiveKLController,
    TokenBatch,
    TokenPPOConfig,
    TokenPPOLearner,
    own_token_gae,
    per_token_rewards,
    token_log_probs,
    token_ppo_loss,
    whitened,
)

@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These models are tiny: per-call overhead dominates and a second intra-op thread only spins
    (badly so when other tests load the 2 cores). Restored afterwards."""
    with torch_threads(1):
        yield


# Row 0: context, own, partner, own, partner, own.  Row 1: context, partner, own, padding...
OWN = np.array([[0, 1, 0, 1, 0, 1],
                [0, 0, 1, 0, 0, 0]], dtype=bool)
# Partner/context positions hold garbage that must not matter (5.0 log-probs, value 100).
LOG_PROBS = np.array([[5.0, -1.0, 5.0, -0.5, 5.0, -2.0],
                      [5.0, 5.0, -0.3, 5.0, 5.0, 5.0]])
REF_LOG_PROBS = np.array([[0.0, -1.2, 0.0, -0.5, 0.0, -1.0],
                          [0.0, 0.0, -0.1, 0.0, 0.0, 0.0]])
VALUES = np.array([[100.0, 1.0, 100.0, 2.0, 100.0, 2.5],
                   [100.0, 100.0, 0.5, 100.0, 100.0, 100.0]])
SCORES = np.array([3.0, -1.0])


def test_per_token_rewards_by_hand():
    rewards = per_token_rewards(LOG_PROBS, REF_LOG_PROBS, OWN, SCORES, beta=0.1)
    # row 0: KL terms 0.2, 0.0, -1.0 -> rewards -0.02, 0, +0.1, score 3 on the last own token
    # row 1: KL term -0.3 - (-0.1) = -0.2 -> +0.02, plus score -1 on its only own token
    expected = np.array([[0, -0.02, 0, 0.0, 0, 0.1 + 3.0],
                         [0, 0, 0.02 - 1.0, 0, 0, 0]])
    np.testing.assert_allclose(rewards, expected, atol=1e-12)


def test_kl_penalty_sign():
    own = np.array([[False, True]])
    above = per_token_rewards(np.array([[0.0, -0.5]]), np.array([[0.0, -1.0]]), own, np.zeros(1), beta=0.2)
    below = per_token_rewards(np.array([[0.0, -1.0]]), np.array([[0.0, -0.5]]), own, np.zeros(1), beta=0.2)
    assert above[0, 1] == pytest.approx(-0.1)  # more likely than the reference: penalised
    assert below[0, 1] == pytest.approx(0.1)


def test_gae_over_own_tokens_by_hand():
    rewards = per_token_rewards(LOG_PROBS, REF_LOG_PROBS, OWN, SCORES, beta=0.1)
    advantages, returns = own_token_gae(rewards, VALUES, OWN, gamma=1.0, lam=0.95)
    # row 0, own tokens t=1,3,5 with values 1, 2, 2.5 and rewards -0.02, 0, 3.1:
    a5 = 3.1 - 2.5                      # 0.6 (terminal: no bootstrap)
    a3 = (0.0 + 2.5 - 2.0) + 0.95 * a5  # 1.07 (bootstrap = next OWN value, partner skipped)
    a1 = (-0.02 + 2.0 - 1.0) + 0.95 * a3  # 1.9965
    # row 1, one own token at t=2: reward -0.98, value 0.5
    expected_adv = np.array([[0, a1, 0, a3, 0, a5],
                             [0, 0, -0.98 - 0.5, 0, 0, 0]])
    np.testing.assert_allclose(advantages, expected_adv, atol=1e-12)
    np.testing.assert_allclose(a1, 1.9965, atol=1e-12)
    expected_ret = np.array([[0, a1 + 1.0, 0, a3 + 2.0, 0, a5 + 2.5],
                             [0, 0, -0.98, 0, 0, 0]])
    np.testing.assert_allclose(returns, expected_ret, atol=1e-12)


def _loss(logits, tokens, old_log_probs, old_values, advantages, returns, values=None):
    config = TokenPPOConfig(ent_coef=0.01, vf_coef=0.1)
    own = torch.from_numpy(OWN)
    values = torch.zeros(OWN.shape) if values is None else values
    return token_ppo_loss(logits, values, tokens, own, torch.as_tensor(old_log_probs, dtype=torch.float32),
                          torch.as_tensor(old_values, dtype=torch.float32),
                          torch.as_tensor(advantages, dtype=torch.float32),
                          torch.as_tensor(returns, dtype=torch.float32), config).total(config.vf_coef, config.ent_coef)


def test_partner_tokens_have_zero_loss_weight():
    gen = torch.Generator().manual_seed(0)
    vocab = 7
    logits = torch.randn(2, 6, vocab, generator=gen, requires_grad=True)
    tokens = torch.randint(0, vocab, (2, 6), generator=gen)
    advantages = np.array([[9.0, 1.0, 9.0, -0.5, 9.0, 2.0], [9.0, 9.0, -1.0, 9.0, 9.0, 9.0]])
    returns = np.array([[9.0, 2.0, 9.0, 1.0, 9.0, 3.0], [9.0, 9.0, 0.5, 9.0, 9.0, 9.0]])
    values = torch.zeros(2, 6, requires_grad=True)
    loss = _loss(logits, tokens, LOG_PROBS, VALUES, advantages, returns, values)
    loss.backward()
    partner = torch.from_numpy(~OWN)
    assert logits.grad[partner].abs().max().item() == 0.0
    assert values.grad[partner].abs().max().item() == 0.0
    assert logits.grad[~partner].abs().max().item() > 0.0

    # Different targets, old log-probs, values, advantages and returns at partner positions:
    # the loss does not move.
    other_tokens = torch.where(partner, (tokens + 3) % vocab, tokens)
    noise = np.where(OWN, 0.0, 17.0)
    changed = _loss(logits, other_tokens, LOG_PROBS + noise, VALUES - noise,
                    np.where(OWN, advantages, -3 * advantages), returns + noise, values)
    assert changed.item() == loss.item()
    # ...while a change at an own position does.
    own_changed = _loss(logits, torch.where(torch.from_numpy(OWN), (tokens + 1) % vocab, tokens),
                        LOG_PROBS, VALUES, advantages, returns, values)
    assert own_changed.item() != loss.item()


def test_advantages_are_whitened_over_the_batch_or_per_role():
    own = np.array([[False, True, True], [False, True, False], [False, True, True], [False, True, False]])
    adv = np.array([[9.0, 1.0, 3.0], [9.0, 2.0, 9.0], [9.0, 100.0, 300.0], [9.0, 200.0, 9.0]])
    roles = np.array([0, 0, 1, 1])
    pooled = whitened(adv, own)
    assert pooled[~own].tolist() == [0.0] * 6 and abs(pooled[own].mean()) < 1e-9
    assert np.all(pooled[:2][own[:2]] < 0)  # role 0's small advantages all look bad next to role 1's
    per_role = whitened(adv, own, roles)
    for role in (0, 1):
        cells = own & (roles == role)[:, None]
        assert abs(per_role[cells].mean()) < 1e-9 and per_role[cells].std() == pytest.approx(1.0, abs=1e-6)
    # same ranks within a role, so the better action of role 0 is now pushed up
    cells = own & (roles == 0)[:, None]
    assert per_role[0, 2] > 0 and np.argsort(per_role[cells]).tolist() == np.argsort(adv[cells]).tolist()


def test_adaptive_kl_controller_moves_beta_the_right_way():
    too_far = AdaptiveKLController(0.2, target=1.0, horizon=1000)
    assert too_far.update(kl=3.0, n_sequences=100) > 0.2  # KL above target: penalise more
    too_close = AdaptiveKLController(0.2, target=1.0, horizon=1000)
    assert too_close.update(kl=0.1, n_sequences=100) < 0.2
    # proportional error clipped at 0.2: beta * (1 + 0.2 * 100 / 1000)
    assert AdaptiveKLController(0.2, 1.0, 1000).update(50.0, 100) == pytest.approx(0.2 * 1.02)
    fixed = AdaptiveKLController(0.2, target=None, horizon=1000)
    assert fixed.update(kl=5.0, n_sequences=100) == 0.2


VOCAB = 8
BOS = 1
TARGET = 3


def _toy_batch(learner: TokenPPOLearner, rng: np.random.Generator, n: int) -> tuple[TokenBatch, np.ndarray]:
    """One-token episodes after a BOS prompt: score 1 for emitting token 3. Token 0 is illegal."""
    legal = np.ones(VOCAB, dtype=bool)
    legal[0] = False
    policy = LMPolicy(learner.model, pad_id=0)
    gen = policy.generate([[BOS]] * n, 1, rng, stop_token=None,
                          legal_mask_fn=lambda rows, new: np.tile(legal, (len(rows), 1)))
    ids = np.concatenate([np.full((n, 1), BOS), gen.tokens], axis=1)
    own = np.array([[False, True]] * n)
    legal_mask = np.tile(legal, (n, 2, 1))
    log_probs = np.concatenate([np.zeros((n, 1), np.float32), gen.log_probs], axis=1)
    values = np.concatenate([np.zeros((n, 1), np.float32), gen.values], axis=1)
    batch = TokenBatch(ids, own, log_probs, values, learner.reference_log_probs(ids, legal_mask),
                       (gen.tokens[:, 0] == TARGET).astype(np.float32), legal_mask)
    return batch, legal_mask


def _prob_of_target(model) -> float:
    with torch.no_grad():
        logits, _, _ = model(torch.tensor([[BOS]]))
        logits[..., 0] = -1e9
        return torch.softmax(logits[0, -1], -1)[TARGET].item()


def test_update_raises_probability_of_rewarded_token():
    model = build_tiny_lm(TinyLMConfig(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=1, n_head=2), seed=0)
    learner = TokenPPOLearner(model, config=TokenPPOConfig(lr=3e-3, kl_beta=0.01, minibatch_size=32), seed=0)
    rng = np.random.default_rng(0)
    before = _prob_of_target(model)

    batch, legal_mask = _toy_batch(learner, rng, 64)
    # The training forward pass reproduces the sampling log-probs (ratio 1 at the first epoch).
    recomputed, _ = token_log_probs(model, batch.input_ids, legal_mask)
    np.testing.assert_allclose(recomputed[:, 1], batch.log_probs[:, 1], atol=1e-5)
    stats = learner.update(batch)
    assert stats.own_tokens == 64 and stats.kl_beta == 0.01
    for _ in range(3):
        learner.update(_toy_batch(learner, rng, 64)[0])
    after = _prob_of_target(model)
    assert before < 0.2 and after > before + 0.2, (before, after)
    # the reference stayed where it was
    assert _prob_of_target(learner.ref_model) == pytest.approx(before, abs=1e-6)
    assert not any(p.requires_grad for p in learner.ref_model.parameters())


def test_imitation_update_lowers_nll_and_schedule():
    model = build_tiny_lm(TinyLMConfig(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=1, n_head=2), seed=1)
    learner = TokenPPOLearner(model, config=TokenPPOConfig(lr=3e-3, imitation_every=2), seed=0)
    # Demonstrations: BOS, partner says 5, the demonstrator answers 3 4 2; padding afterwards.
    ids = np.array([[BOS, 5, 3, 4, 2, 0]] * 8)
    own = np.array([[False, False, True, True, True, False]] * 8)
    batch = TokenBatch.for_imitation(ids, own)
    first = learner.imitation_update(batch)
    for _ in range(20):
        last = learner.imitation_update(batch)
    assert last.nll < first.nll - 0.5
    assert last.own_tokens == 24

    assert not learner.imitation_due
    rl_batch = TokenBatch(ids, own, *token_log_probs(model, ids), learner.reference_log_probs(ids),
                          np.ones(8, np.float32))
    learner.update(rl_batch)
    assert not learner.imitation_due
    learner.update(rl_batch)
    assert learner.imitation_due
    learner.imitation_update(batch)
    assert not learner.imitation_due


def test_token_batch_rejects_own_first_token_and_bad_shapes():
    z = np.zeros((1, 3), np.float32)
    with pytest.raises(ValueError, match="own_mask"):
        TokenBatch(np.zeros((1, 3), np.int64), np.array([[True, False, False]]), z, z, z, np.zeros(1))
    with pytest.raises(ValueError, match="scores"):
        TokenBatch(np.zeros((1, 3), np.int64), np.zeros((1, 3), bool), z, z, z, np.zeros(2))


def test_negotiation_game_sequences_reproduce_behaviour_log_probs():
    """The contract with the dialogue game: a seat's final observation is the causal prefix of all
    its decisions, so one forward pass over it gives back the log-probs and values that `act`
    produced token by token (ratio 1 at PPO's first epoch)."""
    from ludus.agents.policy import ActBatch
    from ludus.games.builtin.negotiation import VOCAB as WORDS
    from ludus.games.builtin.negotiation import Negotiation, own_token_mask

    game = Negotiation()
    model = build_tiny_lm(TinyLMConfig(vocab_size=len(WORDS), n_positions=game.spec.observation_shape[0]), seed=0)
    policy = LMPolicy(model, pad_id=0)
    rng = np.random.default_rng(0)
    game.reset(5)
    decisions: dict[int, list] = {0: [], 1: []}
    while game.to_move():
        (seat,) = game.to_move()
        mask = game.legal_mask(seat)
        out = policy.act(ActBatch(game.observation(seat)[None], mask[None], np.array([seat])), rng)
        decisions[seat].append((out.log_probs[0], out.values[0], mask))
        game.step({seat: int(out.actions[0])})
    for seat in (0, 1):
        final = game.observation(seat)
        own = own_token_mask(final)
        positions = np.flatnonzero(own)
        assert len(positions) == len(decisions[seat])
        legal = np.ones((1, len(final), len(WORDS)), bool)
        legal[0, positions] = [d[2] for d in decisions[seat]]
        log_probs, values = token_log_probs(model, final[None], legal)
        np.testing.assert_allclose(log_probs[0, positions], [d[0] for d in decisions[seat]], atol=1e-5)
        np.testing.assert_allclose(values[0, positions], [d[1] for d in decisions[seat]], atol=1e-5)
