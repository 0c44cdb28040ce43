"""`ludus play` driven by scripted input, and `ludus export` round trips (TorchScript and ONNX)."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch

from ludus.agents.bots.builtin import BotError
from ludus.agents.export import ExportError, export_net, run_exported
from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.play import PlayError, play_terminal
from ludus.agents.snapshot import SnapshotError, load_snapshot, save_snapshot
from ludus.games import registry
from ludus.cli import main


class Terminal:
    """Scripted input and captured output for play_terminal."""

    def __init__(self, lines):
        self.lines = iter(lines)
        self.out: list[str] = []

    def input(self, prompt: str) -> str:
        self.out.append(prompt)
        try:
            return next(self.lines)
        except StopIteration:
            raise EOFError from None

    def print(self, *parts) -> None:
        self.out.append(" ".join(str(p) for p in parts))

    @property
    def text(self) -> str:
        return "\n".join(self.out)


def _cells_forever():
    """Bad input first, then every cell in turn, again and again: illegal ones get re-prompted."""
    return itertools.chain(["", "four", "99"], itertools.cycle(str(c) for c in range(9)))


@pytest.mark.parametrize("seat", [0, 1])
def test_play_tic_tac_toe_to_the_end_against_the_perfect_player(seat):
    term = Terminal(_cells_forever())
    result = play_terminal("tic_tac_toe", "perfect", human_seat=seat, seed=seat, input_fn=term.input,
                           print_fn=term.print)
    assert result.finished and result.human_seat == seat
    assert result.returns[seat] <= 0 and sum(result.returns) == 0  # nobody beats the perfect player
    game = registry.make("tic_tac_toe")
    game.reset(0)
    for action in result.history:  # the recorded game replays legally
        game.step({game.to_move()[0]: action})
    assert tuple(game.returns()) == result.returns
    for expected in ("Your legal moves: [0] [1] [2] [3] [4] [5] [6] [7] [8]" if seat == 0 else "seat 0 plays",
                     "is not a move",
                     "99 is not a legal move", "Game over"):
        assert expected in term.text


def test_play_against_a_snapshot_of_the_game(tmp_path):
    spec = registry.make("spiel:tic_tac_toe").spec
    torch.manual_seed(0)
    net = ActorCritic(spec, NetConfig(hidden=(16,)))
    save_snapshot(net, spec, NetConfig(hidden=(16,)), tmp_path / "snap")
    term = Terminal(itertools.cycle(str(c) for c in range(9)))
    result = play_terminal("spiel:tic_tac_toe", str(tmp_path / "snap"), human_seat=1, seed=3,
                           input_fn=term.input, print_fn=term.print)
    assert result.finished and "Game over" in term.text
    with pytest.raises(SnapshotError, match="not 'tic_tac_toe'"):
        play_terminal("tic_tac_toe", str(tmp_path / "snap"), input_fn=term.input, print_fn=term.print)


def test_end_of_input_leaves_cleanly():
    term = Terminal(["4"])
    result = play_terminal("connect_four", "random", human_seat=0, seed=1, input_fn=term.input, print_fn=term.print)
    assert not result.finished and len(result.history) == 2 and "Bye." in term.text


def test_bad_requests_are_user_errors():
    term = Terminal([])
    with pytest.raises(PlayError, match="--seat 2 does not exist"):
        play_terminal("tic_tac_toe", "random", human_seat=2, input_fn=term.input, print_fn=term.print)
    with pytest.raises(BotError, match="unknown bot"):
        play_terminal("tic_tac_toe", "grandmaster", input_fn=term.input, print_fn=term.print)


def test_cli_play_reads_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(str(c) for c in range(9)) * 3))
    assert main(["play", "tic_tac_toe", "--against", "mcts-20", "--seat", "0", "--seed", "5"]) == 0
    assert "Game over" in capsys.readouterr().out
    assert main(["play", "tic_tac_toe", "--against", "perfect", "--seat", "3"]) == 2
    assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ export

@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    spec = registry.make("connect_four").spec
    config = NetConfig(kind="conv", channels=(4,), hidden=(16,))
    torch.manual_seed(0)
    net = ActorCritic(spec, config)
    with torch.no_grad():  # spread the policy out so a wrong export cannot hide behind near-equal logits
        net.policy_head.weight.mul_(100.0)
    return save_snapshot(net, spec, config, tmp_path_factory.mktemp("export") / "snap").path


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_export_round_trip(tmp_path, snapshot, fmt, capsys):
    out = tmp_path / f"model.{fmt}"
    assert main(["export", str(snapshot), "--format", fmt, "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    # Independently of the exporter's own check: other rows, another batch size.
    net = load_snapshot(snapshot).net
    rng = np.random.default_rng(11)
    obs = rng.random((5, 3, 6, 7)).astype(np.float32)
    mask = rng.random((5, 7)) < 0.5
    mask[:, 6] = True
    logits, value = run_exported(out, fmt, obs, mask)
    with torch.no_grad():
        want_logits, want_value = net(torch.from_numpy(obs), torch.from_numpy(mask))
    np.testing.assert_allclose(logits, want_logits.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, want_value.numpy(), rtol=1e-5, atol=1e-5)
    if fmt == "onnx":
        import onnx

        model = onnx.load(str(out))
        onnx.checker.check_model(model, full_check=True)
        assert [i.name for i in model.graph.input] == ["obs", "mask"]
        assert [o.name for o in model.graph.output] == ["logits", "value"]


def test_export_refusals(tmp_path, snapshot, capsys):
    with pytest.raises(ExportError, match="unknown export format"):
        export_net(load_snapshot(snapshot).net, "tflite", tmp_path / "m")
    with pytest.raises(ExportError, match="is a directory"):
        export_net(load_snapshot(snapshot).net, "torchscript", tmp_path)
    assert main(["export", str(tmp_path / "nothing"), "--format", "onnx", "--out", str(tmp_path / "m")]) == 2
    assert "no snapshot directory" in capsys.readouterr().err
