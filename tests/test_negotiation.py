"""The dialogue games: negotiation (parser, payoffs, observations, text interface, references),
the scripted negotiators and imitation data, and the signalling game."""

from __future__ import annotations

import numpy as np
import pytest

from ludus.agents.policy import ActBatch, Policy, RandomPolicy
from ludus.agents.bots.scripted_negotiator import (
    GREEDY_FAIR, SOFT, TOUGH, GreedyFairNegotiator, RandomSplitNegotiator, generate_dialogues, play_negotiations)
from ludus.games import registry
from ludus.games.check import check_game
from ludus.games.core import GameError
from ludus.games.dialogue import dialogue_outcome, encode_utterance
from ludus.games.builtin.negotiation import (
    CONTEXT_LENGTH, DEAL_ID, EOU_ID, VOCAB, YOU_ID, Context, Negotiation, NegotiationText, UtteranceKind,
    own_token_mask, parse_observation, parse_utterance, reference_scores, sample_contexts, summarize)
from ludus.games.builtin.signalling import Signalling

# counts (2 book, 1 hat, 3 ball); seat 0: 2*2 + 0 + 3*2 = 10; seat 1: 2*1 + 5 + 3*1 = 10
CONTEXT = Context(counts=(2, 1, 3), values=((2, 0, 2), (1, 5, 1)))


def words(text: str) -> list[int]:
    return VOCAB.ids(text.split())


def fresh(context: Context = CONTEXT, **rules) -> Negotiation:
    game = Negotiation(**rules)
    game.reset_context(context)
    return game


def say(game: Negotiation, text: str) -> np.ndarray:
    """Play one whole utterance token by token; returns the rewards summed over its steps."""
    seat = game.to_move()[0]
    total = np.zeros(2, dtype=np.float32)
    for token in words(text) + [EOU_ID]:
        total += game.step({seat: token})
    return total


# -- parser ------------------------------------------------------------------------------------


def test_parser_reads_proposals_deal_and_chat():
    counts = CONTEXT.counts
    proposal = parse_utterance(words("i want 2 book 0 hat 1 ball"), counts)
    assert proposal.kind is UtteranceKind.PROPOSAL and proposal.want == (2, 0, 1)
    assert parse_utterance(words("i want 0 book 0 hat 0 ball"), counts).want == (0, 0, 0)
    assert parse_utterance(words("deal"), counts).kind is UtteranceKind.DEAL
    for chat in ("no", "ok you get the rest", "deal deal", "deal ok", "i want 2 book",
                 "i want 2 hat 0 book 1 ball",          # items out of order
                 "i want 3 book 0 hat 1 ball",          # more books than the pool holds
                 "i want 2 book 0 hat 1 ball ok",       # trailing word
                 "want 2 book 0 hat 1 ball i",
                 "<unk>"):
        assert parse_utterance(words(chat), counts).kind is UtteranceKind.CHAT, chat


# -- rules and payoffs ----------------------------------------------------------------------------


def test_deal_pays_each_seat_its_own_share():
    game = fresh()
    assert not any(say(game, "i want 2 book 0 hat 1 ball"))
    assert game.to_move() == (1,)
    rewards = say(game, "deal")
    # seat 0 takes (2,0,1): 2*2 + 1*2 = 6; seat 1 gets (0,1,2): 5 + 2*1 = 7
    assert rewards.tolist() == [6.0, 7.0] and game.returns().tolist() == [6.0, 7.0]
    assert game.is_terminal() and not game.is_truncated() and game.to_move() == ()
    assert game.agreed() and game.shares().tolist() == [[2, 0, 1], [0, 1, 2]]
    record = game.record()
    assert record.agreed and record.scores == (6.0, 7.0) and record.num_utterances == 2
    assert record.parseable_utterances == 2
    assert dialogue_outcome(game.returns()) == (1, 0)
    with pytest.raises(GameError):
        game.step({0: DEAL_ID})


def test_deal_needs_the_partners_standing_offer_and_the_latest_proposal_counts():
    game = fresh()
    assert not any(say(game, "deal"))                           # nothing to accept: chat
    say(game, "i want 0 book 1 hat 3 ball")                    # seat 1 proposes
    say(game, "i want 2 book 0 hat 3 ball")                    # seat 0 counters: its offer stands
    assert not any(say(game, "ok"))                           # chat keeps the offer standing
    assert not game.is_terminal()
    rewards = say(game, "deal")                                # seat 0 accepting its own offer: chat
    assert not any(rewards) and not game.is_terminal()
    rewards = say(game, "deal")                                # seat 1 accepts seat 0's counter
    assert rewards.tolist() == [10.0, 5.0]
    assert game.num_utterances() == 6 and game.parseable_utterances() == 5


def test_running_out_of_utterances_pays_nothing():
    game = fresh(max_utterances=3)
    say(game, "i want 2 book 1 hat 3 ball")
    say(game, "no")
    rewards = say(game, "i want 1 book 1 hat 1 ball")
    assert game.is_terminal() and not game.is_truncated() and not game.agreed()
    assert rewards.tolist() == [0.0, 0.0] and game.returns().tolist() == [0.0, 0.0]
    assert dialogue_outcome(game.returns()) == (0, 0)
    assert game.shares() is None and "no deal" in game.render()


def test_legal_masks_force_speech_and_cap_utterances():
    game = fresh()
    first = game.legal_mask(0)
    assert not first[EOU_ID]                                   # no empty utterance
    assert not game.legal_mask(1).any()                        # not the speaker
    special = [VOCAB.id(w) for w in VOCAB.special]
    assert not first[special].any() and first[VOCAB.id("<unk>")]
    for token in words("i want 2 book 0 hat 1 ball"):
        game.step({0: token})
    capped = game.legal_mask(0)
    assert capped.sum() == 1 and capped[EOU_ID]                # 8 words: only <eou>
    with pytest.raises(GameError):
        game.step({0: VOCAB.id("ok")})
    with pytest.raises(GameError):
        game.step({1: EOU_ID})
    game.step({0: EOU_ID})
    assert game.to_move() == (1,)
    with pytest.raises(GameError):
        game.step({1: YOU_ID})                                 # special tokens are never legal


def test_observation_layout_and_reading_it_back():
    game = fresh()
    say(game, "i want 2 book 0 hat 1 ball")
    game.step({1: VOCAB.id("no")})                              # seat 1 mid-utterance
    seat0, seat1 = game.observation(0), game.observation(1)
    assert seat0.dtype == np.int64 and seat0.shape == game.spec.observation_shape
    assert VOCAB.words[seat0[1]] == "2" and VOCAB.words[seat0[2]] == "v2"     # 2 books worth 2 each to seat 0
    assert VOCAB.words[seat1[5]] == "v5"                                       # hat worth 5 to seat 1
    assert NegotiationText.decode(seat0[CONTEXT_LENGTH:]) == "YOU: i want 2 book 0 hat 1 ball <eou> THEM: no"
    assert NegotiationText.decode(seat1[CONTEXT_LENGTH:]) == "THEM: i want 2 book 0 hat 1 ball <eou> YOU: no"
    view = parse_observation(seat1)
    assert view.counts == (2, 1, 3) and view.values == (1, 5, 1)
    assert view.current() == tuple(words("no")) and view.standing_offer() == (False, (2, 0, 1))
    assert parse_observation(seat0).standing_offer() == (True, (2, 0, 1))
    mask = own_token_mask(seat1)
    assert NegotiationText.decode(seat1[mask]) == "no"
    assert NegotiationText.decode(seat0[own_token_mask(seat0)]) == "i want 2 book 0 hat 1 ball <eou>"
    assert game.history() == tuple(words("i want 2 book 0 hat 1 ball") + [EOU_ID] + words("no"))
    text = game.render()
    assert "seat 0: i want 2 book 0 hat 1 ball <eou>   [proposal]" in text and "seat 1: no ..." in text


# -- text interface --------------------------------------------------------------------------------


def test_text_interface_plays_whole_utterances():
    game = fresh()
    assert NegotiationText.encode_utterance("I want 2 book 0 hat 1 ball <eou>") == words("i want 2 book 0 hat 1 ball")
    assert NegotiationText.encode_utterance("gimme YOU: v3") == [VOCAB.id("<unk>")] * 3  # unknown/special -> chat
    NegotiationText.play_text_turn(game, 0, "i want 2 book 0 hat 1 ball")
    with pytest.raises(GameError, match="not seat 0's turn"):
        NegotiationText.play_text_turn(game, 0, "deal")
    with pytest.raises(GameError, match="at most 8"):
        NegotiationText.play_text_turn(game, 1, "ok ok ok ok ok ok ok ok ok")
    with pytest.raises(GameError, match="empty"):
        NegotiationText.play_text_turn(game, 1, "  ")
    assert game.utterance_length() == 0 and game.num_utterances() == 1   # failed turns applied nothing
    assert NegotiationText.play_text_turn(game, 1, "please deal") == words("<unk> deal") + [EOU_ID]
    assert game.utterances()[-1].parsed.kind is UtteranceKind.CHAT
    NegotiationText.play_text_turn(game, 0, "deal")                    # own offer: still chat
    NegotiationText.play_text_turn(game, 1, "deal")
    assert game.returns().tolist() == [6.0, 7.0]


def test_signalling_text_interface_rejects_unknown_words():
    game = Signalling()
    with pytest.raises(GameError, match="not speakable"):
        encode_utterance(game.vocab, "hello")


# -- contexts and references ----------------------------------------------------------------------


def test_contexts_satisfy_the_constraints_and_follow_the_seed():
    contexts = sample_contexts(3000, seed=5)
    for ctx in contexts:
        counts, values = np.array(ctx.counts), np.array(ctx.values)
        assert np.all((1 <= counts) & (counts <= 4)) and 5 <= counts.sum() <= 7
        assert np.all((0 <= values) & (values <= 10)) and np.all(values @ counts == 10)
        assert not np.any((values[0] == 0) & (values[1] == 0))       # every item is worth something
        assert np.any((values[0] > 0) & (values[1] > 0))             # some item to both
    assert len({c.counts for c in contexts}) > 20                     # pools vary
    assert sample_contexts(50, seed=5) == contexts[:50]
    a, b = Negotiation(), Negotiation()
    a.reset(123)
    b.reset(123)
    assert a.context() == b.context() and np.array_equal(a.observation(1), b.observation(1))
    with pytest.raises(GameError):
        a.reset_context(Context((2, 1, 3), ((2, 0, 2), (2, 0, 2))))  # nobody values hats
    with pytest.raises(GameError):
        a.reset(-1)


def test_reference_scores_reproduce_the_published_figures():
    refs = reference_scores(sample_contexts(20_000, seed=0))
    assert refs.random_split_joint == pytest.approx(10.0, abs=0.1)
    assert refs.best_joint == pytest.approx(15.1, abs=0.1)
    assert refs.fair_maxmin == pytest.approx(6.67, abs=0.1)


# -- scripted negotiators --------------------------------------------------------------------------


def test_scripted_bots_reach_agreement_and_beat_random_splits():
    assert isinstance(GreedyFairNegotiator(), Policy) and isinstance(RandomSplitNegotiator(), Policy)
    fair = summarize([s.record for s in generate_dialogues(300, 1, [GreedyFairNegotiator()] * 2)])
    assert fair.agreement_rate >= 0.9 and fair.parseable_rate == 1.0
    assert min(fair.mean_scores) > 6.0 and fair.mean_joint > 13.0       # random splits: 5 each, 10 joint
    assert fair.mean_joint <= fair.mean_best_joint
    rand = summarize([s.record for s in generate_dialogues(300, 2, [RandomSplitNegotiator()] * 2)])
    assert rand.agreement_rate == 1.0 and rand.mean_joint == pytest.approx(10.0, abs=0.6)
    tough_vs_soft = summarize([s.record for s in generate_dialogues(
        200, 3, [GreedyFairNegotiator(TOUGH), GreedyFairNegotiator(SOFT)])])
    assert tough_vs_soft.agreement_rate >= 0.9
    assert tough_vs_soft.mean_scores[0] > tough_vs_soft.mean_scores[1] + 1.0   # the anchors differ


def test_greedy_fair_plans_by_the_rules():
    bot = GreedyFairNegotiator(GREEDY_FAIR)
    game = fresh()
    view = parse_observation(game.observation(0))
    share = bot.plan(view)
    parsed = parse_utterance(share[:-1], CONTEXT.counts)
    assert share[-1] == EOU_ID and parsed.kind is UtteranceKind.PROPOSAL
    own = int(np.dot(CONTEXT.values[0], parsed.want))
    assert own >= GREEDY_FAIR.opening and sum(np.subtract(CONTEXT.counts, parsed.want)) >= 1
    say(game, "i want 0 book 1 hat 2 ball")                  # seat 0 leaves seat 1 (2,0,1): worth 3 < 5
    seat1 = parse_observation(game.observation(1))
    assert bot.plan(seat1)[0] != DEAL_ID
    game = fresh()
    say(game, "i want 0 book 0 hat 2 ball")                  # seat 1 keeps (2,1,1): worth 8 >= 5
    assert bot.plan(parse_observation(game.observation(1))) == [DEAL_ID, EOU_ID]
    game = fresh(max_utterances=2)
    say(game, "i want 2 book 1 hat 3 ball")                  # worth 0 to seat 1: even last chance refuses
    assert bot.plan(parse_observation(game.observation(1)))[0] != DEAL_ID


def test_generated_dialogues_are_seeded_and_their_masks_mark_each_seats_tokens():
    bots = [GreedyFairNegotiator(), RandomSplitNegotiator()]
    first = generate_dialogues(40, 7, bots)
    again = generate_dialogues(40, 7, bots)
    other = generate_dialogues(40, 8, bots)
    assert [s.history for s in first] == [s.history for s in again]
    assert [s.seed for s in first] != [s.seed for s in other]
    for sample in first:
        replay = Negotiation()
        replay.reset(sample.seed)
        for token in sample.history:
            seat = replay.to_move()[0]
            # Causal-LM guarantee: the seat's observation when it spoke is a prefix of its final
            # transcript, and the token it chose is the next one there, marked as a target.
            obs = replay.observation(seat)
            seen = int(np.count_nonzero(obs))
            transcript = sample.seats[seat]
            assert np.array_equal(obs[:seen], transcript.tokens[:seen])
            assert transcript.tokens[seen] == token and transcript.targets[seen]
            assert np.array_equal(transcript.legal[seen], replay.legal_mask(seat))
            replay.step({seat: token})
        assert replay.record() == sample.record
        for seat, transcript in enumerate(sample.seats):
            spoken = sum(u.speaker == seat for u in replay.utterances())
            assert np.count_nonzero(transcript.tokens == YOU_ID) == spoken
            assert transcript.targets.sum() == sum(len(u.words) + 1 for u in replay.utterances() if u.speaker == seat)
            assert not transcript.targets[:CONTEXT_LENGTH].any()
            assert np.array_equal(transcript.legal.any(axis=1), transcript.targets)


def test_bots_act_in_batches_and_random_policy_plays_too():
    rng = np.random.default_rng(0)
    games = play_negotiations([RandomPolicy(), GreedyFairNegotiator()], seeds=range(30), rng=rng)
    assert all(g.is_terminal() for g in games)
    records = [g.record() for g in games]
    assert summarize(records).parseable_rate < 1.0                      # random tokens are mostly chat
    game = fresh()
    batch = ActBatch(obs=np.stack([game.observation(0)] * 3), mask=np.stack([game.legal_mask(0)] * 3),
                     seats=np.zeros(3, dtype=np.int64))
    out = GreedyFairNegotiator().act(batch, rng)
    assert out.actions.tolist() == [VOCAB.id("i")] * 3 and out.log_probs.dtype == np.float32


# -- protocol conformance ---------------------------------------------------------------------------


@pytest.mark.parametrize("game_id", ["negotiation", "negotiation(max_utterances=4,max_utterance_tokens=10)",
                                     "signalling", "signalling(num_objects=3,num_words=2,message_length=1)"])
def test_dialogue_games_pass_check_game(game_id):
    report = check_game(game_id, num_games=40)
    assert report.num_terminal == 40 and report.spec.observation_dtype == "int64"
    assert not report.spec.zero_sum and report.spec.utility_sum is None


def test_registry_builds_the_dialogue_games():
    assert "negotiation" in registry.native_names() and "signalling" in registry.native_names()
    game = registry.make("negotiation(max_utterances=4)")
    assert game.spec.id == "negotiation(max_utterances=4)" and game.rules.max_utterances == 4
    with pytest.raises(GameError, match="max_utterance_tokens"):
        registry.make("negotiation(max_utterance_tokens=5)")


# -- signalling -------------------------------------------------------------------------------------


def test_signalling_rewards_a_shared_code():
    game = Signalling()
    v = game.vocab
    correct = 0
    for seed in range(60):
        game.reset(seed)
        target = game.target()
        sender_obs = game.observation(0)
        assert v.words[sender_obs[1]] == f"obj{target}" and v.words[game.observation(1)[1]] == "?"
        # code: object t -> words (t // 4, t % 4); the receiver decodes it from its observation
        game.step({0: v.id(f"w{target // 4}")})
        game.step({0: v.id(f"w{target % 4}")})
        assert game.legal_mask(0).sum() == 1                   # at the word cap only <eou>
        game.step({0: v.id("<eou>")})
        assert game.to_move() == (1,) and game.legal_mask(1).sum() == game.num_objects
        message = game.observation(1)[2:4]
        guess = 4 * int(v.words[message[0]][1:]) + int(v.words[message[1]][1:])
        rewards = game.step({1: v.id(f"pick{guess}")})
        assert rewards.tolist() == [1.0, 1.0] and game.is_terminal()
        correct += 1
    assert correct == 60
    game.reset(0)
    game.step({0: v.id("w0")})
    game.step({0: v.id("<eou>")})
    wrong = (game.target() + 1) % game.num_objects
    assert game.step({1: v.id(f"pick{wrong}")}).tolist() == [0.0, 0.0]


def test_signalling_is_learnable_by_tabular_reinforce():
    """The sanity check the game exists for: two tabular softmax policies trained by REINFORCE
    (Williams 1992) on the shared reward, reading only their observations, agree on a code."""
    game = Signalling(num_objects=3, num_words=3, message_length=1)
    rng = np.random.default_rng(0)
    sender: dict[tuple, np.ndarray] = {}
    receiver: dict[tuple, np.ndarray] = {}

    def sample(table: dict, obs: np.ndarray, mask: np.ndarray) -> tuple[int, tuple, np.ndarray]:
        key = tuple(obs.tolist())
        logits = table.setdefault(key, np.zeros(len(mask)))
        probs = np.where(mask, np.exp(logits - logits[mask].max()), 0.0)
        probs /= probs.sum()
        return int(rng.choice(len(mask), p=probs)), key, probs

    def episode(learning_rate: float) -> float:
        game.reset(int(rng.integers(1 << 30)))
        word, s_key, s_probs = sample(sender, game.observation(0), game.legal_mask(0))
        game.step({0: word})
        game.step({0: int(np.flatnonzero(game.legal_mask(0))[0])})       # <eou> at the cap
        pick, r_key, r_probs = sample(receiver, game.observation(1), game.legal_mask(1))
        reward = float(game.step({1: pick})[1])
        for table, key, probs, action in ((sender, s_key, s_probs, word), (receiver, r_key, r_probs, pick)):
            grad = -probs
            grad[action] += 1.0                                            # d log pi(a) / d logits
            table[key] += learning_rate * (reward - 1 / 3) * grad
        return reward

    before = np.mean([episode(0.0) for _ in range(300)])
    for _ in range(1500):
        episode(0.5)
    after = np.mean([episode(0.0) for _ in range(300)])
    assert before < 0.5 and after > 0.9
