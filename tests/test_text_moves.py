"""Text-move games (GameSpec.text_moves): free-text TextArena games judged by the game, reasoning
before the answer, retries with feedback, and the transcript in the ledger, replays and play."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ludus.agents.lm.pretrained import PretrainedLMConfig, load_pretrained_lm
from ludus.agents.lm.text_policy import InvalidResponses, PromptFormat, TextLMPolicy, TextPlayConfig
from ludus.agents.policy import ActBatch
from ludus.games.core import GameError
from ludus.games.registry import make
from ludus.games.text import text_view

NEGOTIATION = "ta:SimpleNegotiation-v0-short(max_steps=8)"
KUHN = "spiel:kuhn_poker"


@pytest.fixture(scope="module")
def tiny_lm(tiny_bases):
    return load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=3)


def _row(game, seat):
    return ActBatch(game.observation(seat)[None], game.legal_mask(seat)[None], np.array([seat]))


# ------------------------------------------------------------------------------- the game


def test_a_free_text_game_judges_moves_records_them_and_replays_from_its_texts():
    game = make("ta:Nim-v0")
    assert game.spec.text_moves and game.spec.num_actions == 1 and not game.lists_moves()
    game.reset(7)
    game.step_text({0: "[take everything]"})  # invalid: TextArena tells the seat why and lets it move again
    assert game.to_move() == (0,) and game.record().invalid == (1, 0)
    assert "invalid move" in game.text(0)
    game.step_text({0: "[0 1]"})
    while game.to_move():
        seat = game.to_move()[0]
        game.step_text({seat: "[1 1]" if game.record().invalid[seat] == 0 else "nonsense"})
    record = game.record()
    assert len(record.texts) == len(game.history()) and record.error == ""
    replay = make("ta:Nim-v0")
    replay.reset(7)
    for text in record.texts:
        replay.step_text({replay.to_move()[0]: text})
    assert replay.record() == record and np.array_equal(replay.returns(), game.returns())


def test_a_listed_game_plays_actions_and_text_alike():
    game = make("ta:TicTacToe-v0")
    game.reset(1)
    assert game.spec.num_actions == 9 and game.lists_moves() and game.move_text(0, 4) == "[4]"
    game.step_text({0: "[4]"})
    other = make("ta:TicTacToe-v0")
    other.reset(1)
    other.step({0: 4})
    assert np.array_equal(game.observation(1), other.observation(1))
    assert game.history() == (-1,) and other.history() == (4,)


def test_a_game_that_raises_ends_with_an_error_record_not_a_crash(monkeypatch):
    game = make(NEGOTIATION)
    game.reset(3)

    def broken(text):
        raise RuntimeError("the env broke")

    monkeypatch.setattr(game._env, "step", broken)
    rewards = game.step_text({0: "[Accept]"})
    assert rewards.tolist() == [0.0, 0.0] and game.is_terminal() and game.to_move() == ()
    assert "RuntimeError: the env broke" in game.record().error


@pytest.mark.parametrize("game_id", ["ta:Nim-v0", NEGOTIATION, "ta:KuhnPoker-v0"])
def test_text_move_games_pass_the_checker(game_id):
    from ludus.games.check import check_game

    report = check_game(game_id, num_games=3, num_replays=1, num_vector_games=2)
    assert report.num_games == 3


@pytest.mark.parametrize("game_id, message", [
    ("ta:ThreePlayerIPD-v0", "not a two-player game"),
    ("ta:Wordle-v0", "not a two-player game|NLTK"),
    ("ta:SimpleNegotiation-v0(max_steps=99999)", "max_steps must be"),
])
def test_games_two_seats_cannot_play_are_refused_in_one_line(game_id, message):
    with pytest.raises(GameError, match=message) as error:
        make(game_id)
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------- answers, reasoning, retries


def test_a_reasoning_response_is_parsed_by_its_answer_pattern(tiny_lm):
    play = TextPlayConfig(max_new_tokens=64, prompt=PromptFormat(
        think=True, response_prefix="", answer_pattern=r"\\boxed\{([^{}]{1,80})\}"))
    policy = TextLMPolicy(tiny_lm.model, tiny_lm.tokenizer, text_view(KUHN), play)
    game = make(KUHN)
    game.reset(0)
    seat = game.to_move()[0]
    obs, mask = game.observation(seat), game.legal_mask(seat)
    parsed = policy.parse("<think>A king: [check] is weak, so bet.</think> \\boxed{bet}", obs, seat, mask)
    assert parsed.action == 1 and parsed.answer == "bet"
    assert policy.parse("<think>bet</think> [bet]", obs, seat, mask).problem == "no answer"
    free = TextLMPolicy(tiny_lm.model, tiny_lm.tokenizer, text_view(NEGOTIATION), play)
    assert free.free_text
    # the reasoning is never said to the opponent
    assert free.move_text("<think>They need wood.</think> I offer wood. [Offer: 2 Wood -> 1 Ore]") == \
        "I offer wood. [Offer: 2 Wood -> 1 Ore]"
    assert free.move_text("<think>cut short, then \\boxed{Accept}") == "[Accept]"
    with pytest.raises(Exception, match="exactly one group"):
        PromptFormat(answer_pattern=r"\[.*\]")


def test_retries_are_told_why_and_every_attempt_is_counted(tiny_lm):
    # the tiny random model rarely names a legal action: most turns retry
    play = TextPlayConfig(max_new_tokens=6, invalid=InvalidResponses(retries=2, feedback=True))
    policy = TextLMPolicy(tiny_lm.model, tiny_lm.tokenizer, text_view(KUHN), play)
    game = make(KUHN)
    game.reset(0)
    seat = game.to_move()[0]
    batch = ActBatch(np.repeat(game.observation(seat)[None], 16, 0), np.repeat(game.legal_mask(seat)[None], 16, 0),
                     np.full(16, seat))
    out = policy.act(batch, np.random.default_rng(0))
    turns = policy.last_turns
    assert [len(t) for t in turns.all_texts] == turns.attempts.tolist()
    assert out.invalid_answers.tolist() == (turns.attempts - 1 + turns.fallback).tolist()
    assert out.invalid_answers.sum() > 0
    retry = tiny_lm.tokenizer.decode(policy.encode.retry(batch.obs[0], seat, batch.mask[0], "[raise]", "unknown answer"))
    assert "[raise]" in retry and "does not count (unknown answer)" in retry and "[check] [bet]" in retry


def test_a_text_lm_plays_free_text_moves_the_game_judges(tiny_lm):
    play = TextPlayConfig(max_new_tokens=12, prompt=PromptFormat(response_prefix=""))
    policy = TextLMPolicy(tiny_lm.model, tiny_lm.tokenizer, text_view(NEGOTIATION), play)
    game = make(NEGOTIATION)
    game.reset(5)
    out = policy.act(_row(game, 0), np.random.default_rng(1))
    assert out.actions.tolist() == [0] and isinstance(out.texts[0], str)
    assert out.texts[0] == policy.last_turns.texts[0].strip()
    game.step_text({0: out.texts[0]})
    assert game.record().texts == (out.texts[0],)


# ------------------------------------------------------------------------- league, replay, play


def _league_config(base, *extra):
    from ludus.league.api import load_config

    return load_config("llm_kuhn_poker", [
        "learner=text_ppo", f"text_lm.model.base={base}", f"game={NEGOTIATION}", "iterations=2",
        "matches_per_iteration=4", "num_envs=4", "log.wandb=disabled", "log.tensorboard=false",
        "log.progress=false", "text_lm.ppo.minibatch_size=16", "text_lm.ppo.micro_batch_size=8",
        "text_lm.play.prompt.response_prefix=''", "text_lm.play.max_new_tokens=8", *extra])


def test_a_free_text_textarena_league_records_replays_and_resumes_exactly(tiny_bases, tmp_path):
    """With reasoning before the answer (SPIRAL's boxed format): the whole response is trained."""
    from ludus.league.api import League, replay_match
    from ludus.league.check import resumed_fingerprint, run_fingerprint
    from ludus.league.records.ledger import Store

    config = _league_config(tiny_bases[0], "text_lm.play.prompt.think=true",
                            r"text_lm.play.prompt.answer_pattern=\\boxed\{([^{}]{1,80})\}")
    assert config.text_lm.play.prompt.think
    league = League.create(config, tmp_path / "whole")
    league.run()
    league.close()
    with Store.open(tmp_path / "whole", mode="read") as store:
        matches = [recorded.result for recorded in store.iter_matches()]
    lm_seats = [s for m in matches for s in m.seats if s.player_id.startswith(("main", "anchor:base"))]
    assert matches and all(len(m.metadata["texts"]) == m.length for m in matches)
    assert lm_seats and all(s.metadata["turns"] >= 1 for s in lm_seats)
    replay = replay_match(tmp_path / "whole", matches[-1].match_id)
    assert replay.matches and "plays '" in replay.transcript
    reasoned = [m for m in matches if m.metadata.get("reasoning")]
    assert reasoned and all(len(entry) == 3 for m in reasoned for entry in m.metadata["reasoning"])
    assert " wrote: " in replay_match(tmp_path / "whole", reasoned[-1].match_id).transcript
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert sum("losses/main/valid_response_rate" in m for m in metrics) == 2  # an update each iteration
    assert run_fingerprint(tmp_path / "whole") == resumed_fingerprint(config, tmp_path / "half")


def test_a_person_plays_a_free_text_game_in_the_terminal():
    from ludus.agents.play import play_terminal

    said = iter(["[Offer: 1 Wheat -> 1 Wood]", "[Deny]", "hello"] * 10)
    lines: list[str] = []
    result = play_terminal(NEGOTIATION, "random", human_seat=0, seed=2, input_fn=lambda prompt: next(said),
                           print_fn=lambda *a: lines.append(" ".join(map(str, a))))
    assert result.finished and any("Player 0 Inventory" in line for line in lines)
    assert lines[-1].startswith("Game over")


# ------------------------------------------------------------------------------------ the arena

NIM_AGENT = '''
import re


class Agent:
    """Takes one from the first pile that is not empty, as the game's text shows the piles."""

    def act(self, observation, legal_actions):
        text = bytes(int(b) for b in observation).split(b"\\0", 1)[0].decode()
        piles = dict(re.findall(r"pile (\\d+): (\\d+)", text.rsplit("Current Pile", 1)[-1]))
        first = next((p for p, n in piles.items() if int(n) > 0), "0")
        return f"[{first} 1]"
'''


def test_an_arena_plays_a_text_move_game_in_the_sandbox_records_and_replays_it(tmp_path):
    from test_arena import config, require_isolation

    from ludus.arena.api import Arena
    from ludus.arena.replay import replay_match as arena_replay
    from ludus.league.records.ledger import Store

    require_isolation()
    folder = tmp_path / "nim"
    folder.mkdir()
    (folder / "agent.py").write_text(NIM_AGENT)
    (folder / "agent.toml").write_text('name = "nim-taker"\nversion = "1"\ngame = "ta:Nim-v0"\n'
                                       'entry_point = "agent:Agent"\n')
    arena = Arena.open(tmp_path / "arena", "ta:Nim-v0", config())
    arena.submit(folder)
    arena.submit("bot:random")  # plays the empty move, which Nim judges invalid: it loses
    arena.run_tournament(seed=0)
    with Store.open(arena.directory, mode="read") as store:
        matches = [recorded.result for recorded in store.iter_matches()]
    assert matches and all(len(m.metadata["texts"]) == m.length for m in matches)
    taker = [s for m in matches for s in m.seats if s.player_id == "nim-taker"]
    assert all(s.status == "ok" for s in taker) and sum(s.outcome for s in taker) == len(taker)
    replay = arena_replay(matches[0])
    assert replay.consistent and "plays '[" in replay.transcript


def test_the_protocol_takes_text_moves_only_where_the_game_says_so():
    from ludus.arena import protocol
    from ludus.arena.agent_host import answer_line

    hello = protocol.Hello("ta:Nim-v0", 0, 1, 1.0, 0.5, 1, (8192,), text_moves=True)
    assert protocol.decode_arena_line(protocol.encode_hello(hello)) == hello
    board = protocol.Hello("tic_tac_toe", 0, 1, 1.0, 0.5, 9, (27,))
    assert b"text_moves" not in protocol.encode_hello(board)  # other games' hello lines are unchanged
    line = answer_line("[0 1]", text_moves=True)
    assert protocol.decode_agent_line(line, 1, text_moves=True) == protocol.Move("[0 1]")
    with pytest.raises(protocol.ProtocolError, match="moves are actions"):
        protocol.decode_agent_line(line, 9)
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_agent_line(answer_line("4", text_moves=False), 9)  # never coerced into an action
    with pytest.raises(protocol.ProtocolError, match="NUL"):
        protocol.decode_agent_line(b'{"type":"move","text":"a\\u0000b"}\n', 1, text_moves=True)


def test_the_ranking_shows_each_text_agents_invalid_answer_rate():
    from ludus.league.records.ledger import MatchResult, SeatResult
    from ludus.league.records.ranking import format_views, ledger_records, ranking_views

    def match(i, a, b, score_a, invalid_a):
        seats = (SeatResult(0, 0, a, 1.0 if score_a else -1.0, float(score_a), metadata={"turns": 4, "invalid": invalid_a}),
                 SeatResult(1, 1, b, -1.0 if score_a else 1.0, 1.0 - score_a, metadata={"turns": 4, "invalid": 0}))
        return MatchResult(i, "rating", NEGOTIATION, i, seats, 8, 0.0, 0.0)

    matches = [match(i, "lm", "base", i % 3 != 0, 1) for i in range(12)]
    views = ranking_views(ledger_records(matches), rounds=20)
    assert views.answers == {"lm": (48, 12), "base": (48, 0)}
    rows = {r["player"]: r for r in views.rows()}
    assert rows["lm"]["invalid_answer_rate"] == pytest.approx(0.25) and rows["base"]["invalid_answer_rate"] == 0.0
    text = "\n".join(format_views(views))
    assert "invalid answers" in text and "0.25  (12 in 48 turns)" in text


def test_status_shows_a_text_agents_invalid_answer_share(tmp_path):
    from ludus.league.status import MemberStatus, StatusReport, format_status

    members = (MemberStatus("main", "learner", "main", None, None, 10, 0.6, None, 2, 0.1, 8.0, 0.25),
               MemberStatus("anchor:random", "anchor", "anchor", 25.0, 1.0, 10, 0.4, None, 0, -0.1, 8.0, None))
    text = format_status(StatusReport(str(tmp_path), NEGOTIATION, 2, 2, 20, 160, members))
    header, main_row, anchor_row = text.splitlines()[1:4]
    assert header.split()[-1] == "invalid" and main_row.split()[-1] == "0.25" and anchor_row.split()[-1] == "-"
