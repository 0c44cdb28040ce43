"""The negotiation one utterance per step (games/builtin/negotiation_turns.py) and its English text view."""

from __future__ import annotations

import pytest

from ludus.games import registry
from ludus.games.core import GameError
from ludus.games.builtin.negotiation import Context, Negotiation, proposal_tokens, VOCAB
from ludus.games.builtin.negotiation_turns import DEAL, NegotiationTurns, proposal_action
from ludus.games.text import parse_response, text_view

CONTEXT = Context(counts=(1, 3, 2), values=((4, 2, 0), (2, 2, 1)))


def test_a_deal_pays_what_the_token_game_pays():
    turns, tokens = NegotiationTurns(), Negotiation()
    turns.reset_context(CONTEXT)
    tokens.reset_context(CONTEXT)
    turns.step({0: proposal_action((1, 1, 0))})
    turns.step({1: DEAL})
    for seat, words in ((0, proposal_tokens((1, 1, 0))), (1, [VOCAB.id("deal")])):
        for token in [*words, VOCAB.id("<eou>")]:
            tokens.step({seat: token})
    assert turns.is_terminal() and tokens.is_terminal()
    assert turns.returns().tolist() == tokens.returns().tolist() == [6.0, 6.0]


def test_accept_is_legal_only_against_the_partners_proposal_and_proposals_stay_in_the_pool():
    game = NegotiationTurns(max_utterances=3)
    game.reset_context(CONTEXT)
    mask = game.legal_mask(0)
    assert not mask[DEAL] and mask[proposal_action((1, 3, 2))] and not mask[proposal_action((2, 0, 0))]
    game.step({0: proposal_action((1, 0, 0))})
    assert game.legal_mask(1)[DEAL] and not game.legal_mask(0).any()
    with pytest.raises(GameError, match="not legal"):
        game.step({1: proposal_action((0, 4, 0))})
    game.step({1: proposal_action((0, 3, 0))})
    game.step({0: proposal_action((1, 0, 2))})  # the third utterance: out of time, no deal
    assert game.is_terminal() and game.returns().tolist() == [0.0, 0.0]


def test_the_english_view_tells_a_seat_its_own_values_only():
    game = NegotiationTurns()
    game.reset_context(CONTEXT)
    game.step({0: proposal_action((0, 2, 1))})
    view = text_view("negotiation_turns")
    obs, mask = game.observation(1), game.legal_mask(1)
    text = view.state(obs, 1, mask)
    assert "Items on the table: 1 book, 3 hats, 2 balls." in text
    assert "a book 2, a hat 2, a ball 1" in text and "a book 4" not in text  # never the partner's values
    assert "The other player: I propose: 0 books, 2 hats, 1 ball for me." in text
    assert "[accept] (you would get 1 book, 1 hat, 1 ball, worth 5 to you)" in text
    for response, action in (("[propose: 1 book, 1 hat, 0 balls]", proposal_action((1, 1, 0))),
                             ("I want [1 book 3 hats 0 balls]", proposal_action((1, 3, 0))),
                             # items it does not name are 0; plural or not, any wording around the counts
                             ("[Proposal: 1 books and 2 hats for me]", proposal_action((1, 2, 0))),
                             ("[Accept]", DEAL)):
        assert parse_response(view, response, obs, 1, mask).action == action
    assert parse_response(view, "[propose: 2 books, 0 hats, 0 balls]", obs, 1, mask).problem == "illegal answer"
    assert parse_response(view, "[a hat please]", obs, 1, mask).problem == "unknown answer"
    assert parse_response(view, "[1 hat, 2 hats]", obs, 1, mask).problem == "unknown answer"  # which one?


def test_the_lm_league_negotiates_in_english(tiny_bases, tmp_path):
    from ludus.league.api import League, load_config, replay_match
    from ludus.league.records.ledger import Store

    config = load_config("llm_negotiation", [f"text_lm.model.base={tiny_bases[0]}", "iterations=1",
                                             "matches_per_iteration=12", "num_envs=12", "log.wandb=disabled",
                                             "log.tensorboard=false", "log.progress=false",
                                             "text_lm.ppo.minibatch_size=64", "text_lm.ppo.micro_batch_size=32",
                                             # the preset adapts the top 8 of SmolLM2's 30 layers; the tiny Llama has 2
                                             "text_lm.model.lora.layers=1"])
    league = League.create(config, tmp_path / "run")
    league.run()
    assert league.learners["main"].version == 1 and "anchor:base" in league.ratings
    league.close()
    with Store.open(tmp_path / "run", mode="read") as store:
        matches = [recorded.result for recorded in store.iter_matches()]
    assert matches and all(replay_match(tmp_path / "run", m.match_id).matches for m in matches[:3])


def test_bad_parameters_are_one_line_errors():
    with pytest.raises(GameError, match="max_utterances"):
        registry.make("negotiation_turns(max_utterances=1)")
    with pytest.raises(GameError, match="proposal asks"):
        proposal_action((5, 0, 0))
