"""Every numeric config key declares its valid range; values outside, empty and oversized config
files are refused in one line (exit 2) before anything is written (issue 74, item 7)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field

import pytest

from ludus.league.config import LeagueConfig, load_config, preset_names
from ludus.league.configio import MAX_CONFIG_BYTES, ConfigError, format_table, from_dict, ranges
from ludus.bounds import Range, bounds, range_of
from ludus.cli import main


def _is_numeric(tp: typing.Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, tuple):
        return any(_is_numeric(a) for a in typing.get_args(tp) if a not in (type(None), Ellipsis))
    return tp in (int, float)


def _sections(tp: typing.Any) -> list[type]:
    """The config dataclasses inside a field's type: X, X | None, tuple[X, ...]."""
    return [a for a in (typing.get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)]


def numeric_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every int/float field (plain, optional or a tuple of them) of a config tree."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        for section in _sections(tp):
            found += numeric_fields(section, f"{prefix}{f.name}.")
        if not _sections(tp) and _is_numeric(tp):
            found.append((prefix + f.name, f))
    return found


def test_every_numeric_field_of_the_config_tree_declares_a_range():
    fields = numeric_fields(LeagueConfig)
    missing = [key for key, f in fields if range_of(f) is None]
    assert missing == [], f"numeric config keys without a declared range (metadata=bounds(...)): {missing}"
    assert len(fields) >= 120  # the walk reaches every section (roles, text_lm.play.invalid, ...)


@dataclass(frozen=True)
class _PlantedInner:
    width: tuple[int, ...] = (1,)
    ok: float = field(default=0.5, metadata=bounds(0, 1))


@dataclass(frozen=True)
class _PlantedOuter:
    inner: _PlantedInner | None = None
    rate: float | None = None
    name: str = "x"


def test_the_walk_finds_a_numeric_field_without_a_range():
    assert sorted(key for key, f in numeric_fields(_PlantedOuter) if range_of(f) is None) == ["inner.width", "rate"]


def test_defaults_and_every_preset_lie_inside_their_ranges():
    for name in preset_names():
        load_config(name)  # from_dict checks every range
    for key, f in numeric_fields(LeagueConfig):
        default = f.default if f.default is not dataclasses.MISSING else None
        items = default if isinstance(default, tuple) else (default,)
        assert all(item is None or item in range_of(f) for item in items), key


@pytest.mark.parametrize("value, inside", [(0, True), (1, True), (0.5, True), (-1e-9, False), (5, False),
                                           (math.nan, False), (math.inf, False), (True, False), ("0.5", False)])
def test_a_closed_range(value, inside):
    assert (value in Range(0, 1)) is inside


def test_open_and_unbounded_ends_and_how_ranges_print():
    positive = Range(0, None, low_open=True)
    assert 1e300 in positive and 0 not in positive and math.inf not in positive and math.nan not in positive
    assert str(positive) == "(0, inf)" and str(Range(0, 1)) == "[0, 1]"
    assert str(Range(0, 2**63, high_open=True)) == "[0, 2**63)" and str(Range(1, 10**9)) == "[1, 10**9]"
    assert str(Range(0, 1e6)) == "[0, 10**6]" and str(Range(None, 0)) == "(-inf, 0]"


@pytest.mark.parametrize("override, message", [
    ("ppo.gamma=5", "ppo.gamma=5 is outside its range [0, 1]"),
    ("ppo.gamma=-1", "ppo.gamma=-1 is outside its range [0, 1]"),
    ("ppo.gae_lambda=2", "ppo.gae_lambda=2 is outside its range [0, 1]"),
    ("ppo.clip_coef=-1", "ppo.clip_coef=-1 is outside its range (0, 1]"),
    ("ppo.learning_rate=.nan", "ppo.learning_rate=nan is outside its range (0, 1]"),
    ("ppo.max_grad_norm=.inf", "ppo.max_grad_norm=inf is outside its range (0, inf)"),
    ("net.hidden=[64,0]", "net.hidden=[64, 0] is outside its range [1, 65536]"),
    ("roles.main.pfsp=-2", "roles.main.pfsp=-2 is outside its range [0, 10**6]"),
    ("text_lm.play.max_new_tokens=1000000000", "text_lm.play.max_new_tokens=1000000000 is outside its range [1, 4096]"),
    ("text_lm.play.invalid.retries=-1", "text_lm.play.invalid.retries=-1 is outside its range [0, 100]"),
    ("seed=-1", "seed=-1 is outside its range [0, 2**63)"),
])
def test_train_refuses_a_value_outside_its_range_in_one_line_before_writing(override, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "quickstart", "--run", str(run), "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "ludus config show" in err
    assert not run.exists() and list(tmp_path.iterdir()) == []


def test_a_range_error_names_the_key_under_every_section():
    with pytest.raises(ConfigError, match=r"^text_lm\.model\.lora\.dropout=1 is outside its range \[0, 1\)"):
        from_dict(LeagueConfig, {"text_lm": {"model": {"lora": {"dropout": 1}}}})
    with pytest.raises(ConfigError, match=r"^critic\.huber_delta=0 is outside"):
        from_dict(LeagueConfig, {"critic": {"huber_delta": 0}})
    assert from_dict(LeagueConfig, {"critic": {"huber_delta": None}}).critic.huber_delta is None  # None: off


def test_config_show_prints_each_numeric_keys_range(capsys):
    assert main(["config", "show", "--all"]) == 0  # every key (without --all: the blocks its learner uses)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    valid = ranges(LeagueConfig)
    assert "[0, 1]" in lines["ppo.gamma"].split("Discount")[0] and "(0, 1]" in lines["ppo.clip_coef"]
    assert "[1, 4096]" in lines["text_lm.play.max_new_tokens"] and "[0, 10**6]" in lines["roles.main.pfsp"]
    assert all(str(valid[key]) in lines[key] for key in valid)
    assert len(valid) >= 120
    assert format_table(LeagueConfig).splitlines()[0].startswith("game ")


def _train_file(tmp_path, capsys, text: str | bytes) -> str:
    path = tmp_path / "league.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    run = tmp_path / "run"
    assert main(["train", str(path), "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ludus: error: ") and err.count("\n") == 1
    assert not run.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["league.yaml"]
    return err


def test_an_empty_config_file_is_refused(tmp_path, capsys):
    assert "is empty" in _train_file(tmp_path, capsys, "")
    assert "is empty" in _train_file(tmp_path, capsys, "# only a comment\n")


def test_deeply_nested_yaml_is_refused_not_a_recursion_error(tmp_path, capsys):
    assert "nests deeper than 50 levels" in _train_file(tmp_path, capsys, "[" * 100_000)
    block = "".join(f"{' ' * i}k{i}:\n" for i in range(60)) + " " * 60 + "v: 1\n"
    assert "nests deeper than 50 levels" in _train_file(tmp_path, capsys, block)


def test_an_oversized_or_alias_bomb_config_file_is_refused(tmp_path, capsys):
    big = "game: tic_tac_toe\n" + "#" * MAX_CONFIG_BYTES + "\n"
    assert "more than a config's" in _train_file(tmp_path, capsys, big)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    assert "more than 100,000 values" in _train_file(tmp_path, capsys, bomb)


def test_a_too_deep_set_value_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "quickstart", "--run", str(run), "--set", "anchors=" + "[" * 5000]) == 2
    err = capsys.readouterr().err
    assert "nests deeper than 50 levels" in err and err.count("\n") == 1 and not run.exists()
