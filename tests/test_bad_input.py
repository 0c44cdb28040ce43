"""Bad input that used to train, crash or play anyway (issue 74, item 7): each is refused through
the real CLI in one line with exit 2, and nothing stored changes."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ludus.agents.lm.model import LMError
from ludus.agents.lm.text_policy import PROMPT_FIELDS, TextPlayConfig, template_problem
from ludus.cli import main

KUHN = "spiel:kuhn_poker"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("ludus: error: ") and err.count("\n") == 1, err
    return err


def _tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ an LM snapshot's play settings

GOOD_PLAY = TextPlayConfig(max_new_tokens=3).to_json()


def _play(change) -> dict:
    data = copy.deepcopy(GOOD_PLAY)
    change(data)
    return data


BAD_PLAYS = {
    "unknown placeholder": (_play(lambda d: d["prompt"].update(system="{nope}")), "fills in {nope}"),
    "huge format spec": (_play(lambda d: d["prompt"].update(user="{rules:>99999999999}")), "formats {rules} with :>"),
    "conversion": (_play(lambda d: d["prompt"].update(user="{state!r}")), "formats {state} with !r"),
    "attribute": (_play(lambda d: d["prompt"].update(user="{rules.__class__}")), "fills in {rules.__class__}"),
    "positional": (_play(lambda d: d["prompt"].update(user="{0}")), "fills in {0}"),
    "lone brace": (_play(lambda d: d["prompt"].update(system="{")), "is not a format template"),
    "token budget": (_play(lambda d: d.update(max_new_tokens=10**9)), "max_new_tokens=1000000000 is outside its range"),
    "float budget": (_play(lambda d: d.update(max_new_tokens=1e9)), "max_new_tokens must be int"),
    "unknown key": (_play(lambda d: d.update(beam_width=4)), "unknown key beam_width"),
    "unknown prompt key": (_play(lambda d: d["prompt"].update(style="x")), "unknown key prompt.style"),
    "negative retries": (_play(lambda d: d["invalid"].update(retries=-1)), "invalid.retries=-1 is outside"),
    "string temperature": (_play(lambda d: d.update(temperature="hot")), "temperature must be float"),
    "not a mapping": ([1, 2], "must be a mapping"),
}


def test_a_good_play_record_round_trips_and_keys_left_out_take_defaults():
    assert TextPlayConfig.from_json(GOOD_PLAY) == TextPlayConfig(max_new_tokens=3)
    assert TextPlayConfig.from_json({"max_new_tokens": 5}) == TextPlayConfig(max_new_tokens=5)
    assert all(template_problem("{" + name + "}") is None for name in PROMPT_FIELDS)


@pytest.mark.parametrize("case", sorted(BAD_PLAYS))
def test_a_play_record_that_cannot_play_is_refused_in_one_line(case):
    data, message = BAD_PLAYS[case]
    with pytest.raises(LMError) as raised:
        TextPlayConfig.from_json(data)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_token_budget_must_fit_the_models_context():
    with pytest.raises(LMError, match="does not fit the model's context of 256 tokens"):
        TextPlayConfig.from_json({**GOOD_PLAY, "max_new_tokens": 300}, context=256)
    assert TextPlayConfig.from_json({**GOOD_PLAY, "max_new_tokens": 200}, context=256).max_new_tokens == 200


def test_a_config_prompt_template_is_checked_too(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "llm_kuhn_poker", "--run", str(run), "--set", 'text_lm.play.prompt.system="{rules} {nope}"']) == 2
    assert "fills in {nope}" in _one_line_error(capsys) and not run.exists()


def _respliced(source: Path, target: Path, **architecture) -> Path:
    """A copy of snapshot `source` whose manifest's architecture record has `architecture` changes,
    rehashed (a well-formed snapshot, as a submitter could write one)."""
    from ludus.agents.snapshot import ADAPTER_WEIGHTS_NAME, MANIFEST_NAME, write_snapshot

    header = json.loads((source / MANIFEST_NAME).read_text())
    header.pop("files", None)
    header["architecture"] = {**header["architecture"], **architecture}
    write_snapshot(target, header, {ADAPTER_WEIGHTS_NAME: (source / ADAPTER_WEIGHTS_NAME).read_bytes()})
    return target


@pytest.fixture(scope="module")
def lm_snapshot(tiny_bases, tmp_path_factory) -> Path:
    from ludus.agents.lm.pretrained import PretrainedLMConfig, load_pretrained_lm
    from ludus.agents.lm.snapshots import save_adapter_snapshot
    from ludus.games import registry

    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0])), seed=1)
    path = tmp_path_factory.mktemp("lm") / "snap"
    save_adapter_snapshot(lm, registry.spec(KUHN), path, play=GOOD_PLAY)
    return path


@pytest.mark.parametrize("case", ["unknown placeholder", "huge format spec", "token budget", "unknown prompt key"])
def test_evaluate_refuses_an_lm_snapshot_that_cannot_play(case, lm_snapshot, tiny_bases, tmp_path, capsys):
    bad = _respliced(lm_snapshot, tmp_path / "bad", play=BAD_PLAYS[case][0])
    before = _tree(bad)
    assert main(["evaluate", str(bad), "--exploitability", "--base", str(tiny_bases[0])]) == 2
    err = _one_line_error(capsys)
    assert "records play settings it cannot play with" in err and BAD_PLAYS[case][1] in err
    assert _tree(bad) == before


def test_the_local_base_error_names_the_cli_flag(lm_snapshot, capsys):
    assert main(["evaluate", str(lm_snapshot), "--exploitability"]) == 2
    err = _one_line_error(capsys)
    assert "trained on a local base model" in err and "--base DIR" in err


def test_arena_submit_refuses_an_lm_snapshot_that_cannot_play(lm_snapshot, smollm2_dir, tmp_path, capsys):
    """The snapshot names the base the host ships (its id and content hash), so the sandboxed check
    gets as far as its play settings; it is refused before it can forfeit every match."""
    from ludus.agents.lm.pretrained import base_content_hash

    bad = _respliced(lm_snapshot, tmp_path / "bad", base="smollm2-135m-instruct",
                     base_hash=base_content_hash(smollm2_dir), play=BAD_PLAYS["unknown placeholder"][0])
    arena = tmp_path / "arena"
    assert main(["arena", "submit", "--arena", str(arena), str(bad), "--game", KUHN]) == 2
    err = _one_line_error(capsys)
    assert "fills in {nope}" in err
    assert main(["arena", "list", "--arena", str(arena)]) == 0  # the refused snapshot did not enter
    assert "bad" not in capsys.readouterr().out


# ------------------------------------------------------------------ evaluate --against a run

SMALL_TTT = Path(__file__).parent / "fixtures" / "small_tic_tac_toe.yaml"
"""The small league the shared run is made of (the quickstart preset before it trained to learn)."""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from ludus.league.api import League
    from ludus.league.config import load_config

    path = tmp_path_factory.mktemp("bad-input") / "run"
    league = League.create(load_config(str(SMALL_TTT), ["iterations=2", "log.progress=false"]), path)
    try:
        league.run()
    finally:
        league.close()
    return path


def test_evaluate_against_refuses_a_member_whose_snapshot_was_swapped(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    snapshots = run / "snapshots"
    assert (snapshots / "main@0").is_dir() and (snapshots / "main@1").is_dir()
    shutil.rmtree(snapshots / "main@1")
    shutil.copytree(snapshots / "main@0", snapshots / "main@1")  # another snapshot of the same game
    before = _tree(run)
    assert main(["evaluate", str(snapshots / "main@0"), "--against", str(run), "--games", "2"]) == 2
    err = _one_line_error(capsys)
    assert "snapshot main@1" in err and "the run recorded" in err
    assert _tree(run) == before


def test_evaluate_base_with_against_is_refused(run_dir, capsys):
    snapshot = run_dir / "snapshots" / "main@0"
    assert main(["evaluate", str(snapshot), "--against", str(run_dir), "--base", "/nowhere"]) == 2
    assert "--base loads one LM snapshot for --exploitability only" in _one_line_error(capsys)
    assert main(["evaluate", str(snapshot), "--probe-steps", "10", "--base", "/nowhere"]) == 2
    assert "--base" in _one_line_error(capsys)


# ------------------------------------------------------------------ games --check

def test_games_check_of_a_module_whose_import_raises_is_one_line(capsys):
    assert main(["games", "--check", "pz:pettingzoo.mpe.simple_adversary_v3"]) == 2
    err = _one_line_error(capsys)
    assert "cannot be imported" in err and "mpe2" in err and "Traceback" not in err
