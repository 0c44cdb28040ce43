"""Dialogue in the league: runner rows -> token batches, a token-PPO league end to end, exact
resume, LM snapshots, the negotiation evaluation and playing a trained agent in the terminal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.lm import LMPolicy
from agents.policy import ActBatch
from agents.rollout import RolloutBatch
from agents.snapshot import SnapshotError, load_lm_snapshot, policy_from_snapshot, read_manifest
from games import registry
from league.api import League, load_config
from league.config import ConfigError
from league.dialogue import (dialogue_episodes, evaluate_negotiators, held_out_contexts, mean_interval,
                             score_gain)
from league.ledger import Store


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models: a second intra-op thread only spins (and the serial runner uses one anyway)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- RolloutBatch -> dialogues ------------------------------------------------------------------


def rollout(rows: list[tuple]) -> RolloutBatch:
    """Rows of (slot, seat, obs, action, logprob, value, reward, done) over a 5-token vocabulary... of 10."""
    n = len(rows)
    mask = np.zeros((n, 10), dtype=bool)
    for i, row in enumerate(rows):
        mask[i, row[3]] = True
        mask[i, 9] = True
    return RolloutBatch(
        obs=np.array([r[2] for r in rows], dtype=np.int64), mask=mask,
        actions=np.array([r[3] for r in rows], dtype=np.int64),
        logprobs=np.array([r[4] for r in rows], dtype=np.float32),
        values=np.array([r[5] for r in rows], dtype=np.float32),
        rewards=np.array([r[6] for r in rows], dtype=np.float32),
        dones=np.array([r[7] for r in rows], dtype=bool),
        advantages=np.zeros(n, np.float32), returns=np.zeros(n, np.float32),
        policy_version=np.zeros(n, np.int64),
        slots=np.array([r[0] for r in rows], dtype=np.int64), seats=np.array([r[1] for r in rows], dtype=np.int64))


LITERAL = [
    # slot 0, seat 1: a game of two decisions (the partner said token 3 in between) ...
    (0, 1, [5, 9, 0, 0, 0, 0], 7, -0.1, 0.5, 0.0, False),
    (0, 1, [5, 9, 7, 3, 0, 0], 8, -0.2, 0.6, 2.0, True),
    # ... then the slot's next game, one decision.
    (0, 1, [6, 0, 0, 0, 0, 0], 4, -0.3, 0.7, 1.0, True),
    # slot 1, seat 0: the observation fills the row, so the token lands in the extra last column.
    (1, 0, [1, 2, 3, 4, 5, 6], 9, -0.4, 0.8, -1.0, True),
    # a second runner's batch, concatenated: its slot 0 seat 1 is a different game.
    (0, 1, [2, 0, 0, 0, 0, 0], 3, -0.5, 0.9, 0.5, False),
    (0, 1, [2, 3, 1, 0, 0, 0], 1, -0.6, 1.0, 0.25, True),
]


def test_rollout_rows_become_whole_dialogues_aligned_by_position():
    episodes = dialogue_episodes(rollout(LITERAL))
    np.testing.assert_array_equal(episodes.input_ids, [
        [5, 9, 7, 3, 8, 0, 0],
        [6, 4, 0, 0, 0, 0, 0],
        [1, 2, 3, 4, 5, 6, 9],
        [2, 3, 1, 1, 0, 0, 0],
    ])
    np.testing.assert_array_equal(np.argwhere(episodes.own_mask), [[0, 2], [0, 4], [1, 1], [2, 6], [3, 1], [3, 3]])
    np.testing.assert_allclose(episodes.log_probs[episodes.own_mask], [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    np.testing.assert_allclose(episodes.values[episodes.own_mask], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert episodes.log_probs[~episodes.own_mask].sum() == 0 and episodes.values[~episodes.own_mask].sum() == 0
    np.testing.assert_allclose(episodes.scores, [2.0, 1.0, -1.0, 0.75])
    np.testing.assert_array_equal(episodes.seats, [1, 1, 0, 1])
    # The legal mask of each decision sits at its token's position, and nowhere else.
    assert episodes.legal_mask[0, 2, 7] and episodes.legal_mask[0, 4, 8] and episodes.legal_mask[2, 6, 9]
    assert not episodes.legal_mask[~episodes.own_mask].any()
    batch = episodes.token_batch(np.zeros_like(episodes.log_probs))
    assert len(batch) == 4 and batch.legal_mask.shape == (4, 7, 10)


def test_rollout_rows_that_are_not_whole_causal_dialogues_are_refused():
    unfinished = [r if i != 1 else r[:7] + (False,) for i, r in enumerate(LITERAL[:2])]
    with pytest.raises(ValueError, match="not finished"):
        dialogue_episodes(rollout(unfinished))
    rewritten = [LITERAL[0], (0, 1, [5, 8, 7, 3, 0, 0], 8, -0.2, 0.6, 2.0, True)]  # history changed
    with pytest.raises(ValueError, match="not a prefix"):
        dialogue_episodes(rollout(rewritten))
    wrong_token = [LITERAL[0], (0, 1, [5, 9, 6, 3, 0, 0], 8, -0.2, 0.6, 2.0, True)]  # row 0's token is not 6
    with pytest.raises(ValueError, match="not a prefix"):
        dialogue_episodes(rollout(wrong_token))


# -- a token-PPO league end to end ---------------------------------------------------------------

TINY = ["iterations=2", "matches_per_iteration=8", "num_envs=8", "snapshot_every_steps=40", "rating_share=0.2",
        "log.progress=false", "log.wandb=disabled", "log.tensorboard=false",
        "dialogue.lm.n_embd=16", "dialogue.lm.n_layer=1", "dialogue.lm.n_head=2",
        "dialogue.imitation_steps=3", "dialogue.imitation_batch_size=8", "dialogue.imitation_dialogues=16",
        "dialogue.token_ppo.epochs=1", "dialogue.token_ppo.minibatch_size=8", "dialogue.token_ppo.imitation_every=1"]


def tiny_config(*extra: str):
    return load_config("negotiation", TINY + list(extra))


def train(config, run_dir: Path, until: int | None = None) -> None:
    league = League.create(config, run_dir)
    try:
        league.run(until_iteration=until)
    finally:
        league.close()


def ledger_rows(run_dir: Path) -> list[tuple]:
    with Store.open(run_dir, mode="read") as store:
        rows = [(r.seq, r.result.match_id, r.result.seed, json.dumps(dict(r.result.metadata), sort_keys=True),
                 tuple((s.player_id, s.player_version, s.episode_return, s.outcome) for s in r.result.seats))
                for r in store.iter_matches()]
        return rows + [(r.seq, r.player_id, r.mu, r.sigma) for r in store.ratings_history()]


def snapshot_hashes(run_dir: Path) -> dict[str, str]:
    return {m.parent.name: hashlib.sha256(m.read_bytes()).hexdigest()
            for m in sorted((run_dir / "snapshots").glob("*/manifest.json"))}


def test_negotiation_league_runs_and_freezes_lm_snapshots_that_play(tmp_path):
    config = tiny_config()
    assert config.learner == "token_ppo" and any(a.startswith("negotiator-") for a in config.anchors)
    league = League.create(config, tmp_path / "run")
    try:
        summaries = league.run()
        learner = league.learners["main"].impl
        assert learner.warm_start.steps == 3 and learner.updates == 2
    finally:
        league.close()
    losses = summaries[-1].losses["main"]
    for key in ("policy_loss", "kl_to_reference", "mean_score", "agreement_rate", "own_parseable_rate",
                "imitation_nll", "games"):
        assert np.isfinite(losses[key]), key
    snapshots = snapshot_hashes(tmp_path / "run")
    assert "main@0" in snapshots and len(snapshots) >= 2
    game = registry.make("negotiation")
    for name in snapshots:
        path = tmp_path / "run" / "snapshots" / name
        assert read_manifest(path)[0].kind == "lm"
        policy = policy_from_snapshot(path, expect_game="negotiation")
        assert isinstance(policy, LMPolicy)
        game.reset(3)
        out = policy.act(ActBatch(game.observation(0)[None], game.legal_mask(0)[None], np.zeros(1, np.int64)),
                         np.random.default_rng(0))
        assert game.legal_mask(0)[out.actions[0]]
    with pytest.raises(SnapshotError, match="not 'signalling'"):
        load_lm_snapshot(tmp_path / "run" / "snapshots" / "main@0", expect_game="signalling")
    # Rating matches between LM snapshots and scripted anchors were played and rated.
    with Store.open(tmp_path / "run", mode="read") as store:
        kinds = {r.result.kind for r in store.iter_matches()}
    assert kinds == {"training", "rating"}


def test_token_ppo_league_resume_equals_uninterrupted_run(tmp_path):
    config = tiny_config("iterations=3")
    train(config, tmp_path / "full")
    train(config, tmp_path / "split", until=1)
    league = League.resume(tmp_path / "split")
    try:
        assert league.learners["main"].impl.warm_start is None  # restored, not re-imitated
        league.run()
    finally:
        league.close()
    assert ledger_rows(tmp_path / "full") == ledger_rows(tmp_path / "split")
    assert snapshot_hashes(tmp_path / "full") == snapshot_hashes(tmp_path / "split")
    state = {}
    for run in ("full", "split"):
        pointer = json.loads((tmp_path / run / "checkpoint.json").read_text())
        from safetensors.torch import load_file

        state[run] = load_file(tmp_path / run / pointer["path"] / "learner-main.safetensors")
    assert state["full"].keys() == state["split"].keys()
    assert all(torch.equal(state["full"][k], state["split"][k]) for k in state["full"])


def test_token_ppo_refuses_games_it_cannot_play():
    with pytest.raises(ConfigError, match="token games"):
        League.create(load_config("negotiation", TINY + ["game=tic_tac_toe", "anchors=[random]"]), "/nonexistent/x")
    with pytest.raises(ConfigError, match="imitation_steps=0"):
        League.create(load_config("negotiation", TINY + ["game=signalling", "anchors=[random]"]), "/nonexistent/y")
