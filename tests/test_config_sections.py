"""Config by sections (issue 75): presets are YAML files in the package, a file may start from one
(`preset: NAME`), `ludus config show` prints the common keys and the blocks the config's learner,
backend and game use (`--all`, `--yaml`, `--diff`), and a misspelt `--set` key gets a suggestion."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ludus.league.config import (LeagueConfig, PRESETS_DIR, changed_keys, config_yaml, load_config, preset_names,
                                 preset_summary, sections_for, shown_keys)
from ludus.league.configio import ConfigError, describe, to_dict

FIXTURE = Path(__file__).parent / "fixtures" / "preset_configs.json"
"""Every preset's config (`to_dict`) as 3caf3f1 built it from league/config.py's PRESETS dicts, with issue 79's
changes: log.wandb disabled by default, the game_module key, the quickstart retuned to learn."""

ALL_KEYS = {key for key, value, _ in describe(LeagueConfig) if value != ""}
HEADINGS = {key for key, value, _ in describe(LeagueConfig) if value == ""}


def table_keys(out: str) -> list[str]:
    """The keys of a `ludus config show` table (not the sections' headings)."""
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] not in HEADINGS]


def test_every_preset_is_the_config_it_was_before_it_became_a_file():
    recorded = json.loads(FIXTURE.read_text())
    assert preset_names() == sorted(recorded)
    for name in preset_names():
        # json.dumps on both sides: 1 and 1.0 differ there, as they would in a run's config.json
        assert json.dumps(to_dict(load_config(name)), sort_keys=True) == json.dumps(recorded[name], sort_keys=True), name


def test_every_preset_file_opens_with_what_it_trains_the_figure_and_the_doc():
    for name in preset_names():
        head = (PRESETS_DIR / f"{name}.yaml").read_text().splitlines()[:3]
        assert all(line.startswith("# ") for line in head), name
        assert head[1].startswith("# Reached: ") and head[2].startswith("# Read: ") and "docs/" in head[2], name
        assert preset_summary(name) == head[0][2:]


def test_config_list_shows_each_preset_with_its_summary(ludus_here):
    done = ludus_here("config", "list")
    code, out = done.returncode, done.stdout
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == preset_names()
    assert all(preset_summary(line.split()[0]) in line for line in lines)


def test_a_file_starts_from_a_preset_and_its_keys_override_it(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("preset: tic_tac_toe\niterations: 7\nppo:\n  learning_rate: 0.002\nanchors: [random]\n")
    config = load_config(str(path))
    base = load_config("tic_tac_toe")
    assert config.iterations == 7 and config.ppo.learning_rate == 0.002 and config.anchors == ("random",)
    assert config.ppo.update_epochs == base.ppo.update_epochs == 8  # nested merge: the preset's other ppo keys stay
    assert config.net == base.net and config.roles == base.roles
    assert load_config(str(path), ["iterations=9"]).iterations == 9  # --set on top of both


def test_a_file_naming_only_a_preset_is_that_preset(tmp_path):
    path = tmp_path / "same.yaml"
    path.write_text("preset: connect_four\n")
    assert load_config(str(path)) == load_config("connect_four")


@pytest.mark.parametrize("text, message", [
    ("preset: tic_tac_tow\n", "unknown preset 'tic_tac_tow' (did you mean 'tic_tac_toe'?)"),
    ("preset: [1]\n", "expected a preset name"),
])
def test_an_unknown_preset_is_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(str(path))
    assert "\n" not in str(info.value)


def test_config_show_tic_tac_toe_prints_under_60_keys_and_all_prints_every_one(ludus_here):
    done = ludus_here("config", "show", "tic_tac_toe")
    code, out = done.returncode, done.stdout
    assert code == 0
    keys = table_keys(out)
    assert len(out.splitlines()) == len(keys) < 60
    assert not any(key.startswith(("text_lm", "dialogue", "critic", "cfr", "learner_backend.zero_stage"))
                   for key in keys)
    assert {"ppo.learning_rate", "net.hidden", "roles.main.pfsp", "learner_backend.backend", "iterations"} <= set(keys)
    done = ludus_here("config", "show", "tic_tac_toe", "--all")
    code, out = done.returncode, done.stdout
    assert code == 0
    assert ALL_KEYS <= set(table_keys(out)) and len(ALL_KEYS) > 170


def test_sections_follow_the_learner_and_the_backend():
    assert sections_for(load_config("tic_tac_toe")) == {"roles", "log", "net", "ppo", "learner_backend.backend"}
    assert sections_for(load_config("leduc_poker")) == {"roles", "log", "net", "cfr"}
    assert sections_for(load_config("simple_tag")) == {"roles", "log", "net", "ppo", "critic"}
    assert sections_for(load_config("negotiation")) == {"roles", "log", "dialogue"}
    assert sections_for(load_config("llm_kuhn_poker")) == {"roles", "log", "text_lm.model", "text_lm.play",
                                                           "text_lm.mmd"}
    deepspeed = load_config("quickstart", ["learner_backend.backend=deepspeed", "ppo.minibatch_size=64"])
    assert "learner_backend" in sections_for(deepspeed)


def test_show_hides_nothing_that_is_set():
    for name in preset_names():
        config = load_config(name)
        names = {f"roles.{role.name}.name" for role in config.roles}
        assert changed_keys(config) - names <= shown_keys(config), name
    config = load_config("tic_tac_toe", ["text_lm.play.temperature=0.3"])  # unused by PPO, but set: shown
    assert "text_lm.play.temperature" in shown_keys(config)


def test_a_team_game_shows_the_roles_side_and_poker_the_psro_weights():
    assert "roles.prey.team" in shown_keys(load_config("simple_tag"))
    assert "roles.main.team" not in shown_keys(load_config("tic_tac_toe"))
    assert "roles.main.meta_nash" in shown_keys(load_config("kuhn_poker"))
    assert "roles.main.meta_nash" not in shown_keys(load_config("tic_tac_toe"))


def test_diff_prints_only_the_keys_away_from_the_defaults(ludus_here):
    done = ludus_here("config", "show", "tic_tac_toe", "--diff")
    code, out = done.returncode, done.stdout
    assert code == 0
    keys = set(table_keys(out))
    assert keys == changed_keys(load_config("tic_tac_toe"))
    assert {"iterations", "ppo.learning_rate", "net.hidden", "roles.main.pfsp_power"} <= keys
    assert "seed" not in keys and "ppo.gamma" not in keys
    done = ludus_here("config", "show", "--diff")
    code, out = done.returncode, done.stdout
    assert code == 0 and out.strip() == "(no keys)"


@pytest.mark.parametrize("everything", [False, True])
def test_yaml_round_trips_every_preset(tmp_path, everything):
    for name in preset_names():
        config = load_config(name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(config_yaml(config, everything))
        assert load_config(str(path)) == config, name


def test_config_show_yaml_is_a_runnable_file(tmp_path, ludus_here):
    done = ludus_here("config", "show", "simple_tag", "--yaml", "--set", "iterations=3")
    code, out = done.returncode, done.stdout
    assert code == 0
    path = tmp_path / "tag.yaml"
    path.write_text(out)
    assert load_config(str(path)) == load_config("simple_tag", ["iterations=3"])
    assert "text_lm" not in out and "iterations: 3" in out


@pytest.mark.parametrize("override, hint", [
    ("ppo.lr=1e-3", "(did you mean ppo.learning_rate?)"),
    ("ppo.learning_rte=1e-3", "(did you mean ppo.learning_rate?)"),
    ("ppo.epochs=3", "(did you mean ppo.update_epochs?)"),
    ("net.hiden=[8]", "(did you mean net.hidden?)"),
    ("roles.main.pfps=1", "(did you mean roles.main.pfsp?)"),
    ("text_lm.play.temprature=1", "(did you mean text_lm.play.temperature?)"),
    ("learning_rate=1e-3", "(did you mean ppo.learning_rate?)"),
    ("iteratons=3", "(did you mean iterations?)"),
    ("dialogue.token_ppo.learning_rate=1e-3", "(did you mean dialogue.token_ppo.lr?)"),
])
def test_a_misspelt_set_key_gets_a_suggestion(override, hint):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=re.escape(f"unknown config key {key!r} {hint}")) as info:
        load_config("quickstart", [override])
    assert "\n" not in str(info.value)


def test_config_show_without_a_preset_applies_set(ludus_here):
    done = ludus_here("config", "show", "--set", "iterations=3", "--diff")
    assert done.returncode == 0 and table_keys(done.stdout) == ["iterations"] and " 3 " in done.stdout
    done = ludus_here("config", "show", "--set", "ppo.lr=3")
    assert done.returncode == 2 and "did you mean ppo.learning_rate?" in done.stderr
