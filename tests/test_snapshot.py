"""Snapshots: round trip, content ids, immutability, and a one-line refusal for every kind of damage."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from ludus.agents.nets import ActorCritic, NetConfig
from ludus.agents.policy import ActBatch
from ludus.agents.snapshot import (MANIFEST_NAME, WEIGHTS_NAME, Lineage, SnapshotError, canonical_json, load_snapshot,
                             policy_from_snapshot, save_snapshot, sha256_hex, verify_snapshot, write_snapshot)
from ludus.agents.torch_policy import TorchPolicy
from ludus.games.core import GameSpec

SPEC = GameSpec("connect_four", num_players=2, num_actions=7, observation_shape=(3, 6, 7), spiel_name="connect_four")
CONFIG = NetConfig(hidden=(32, 32))
LINEAGE = Lineage(parent=None, role="main", steps=1000, created_by="test")


def _net(config: NetConfig = CONFIG, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(SPEC, config)


def _inputs(rows: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    mask = rng.random((rows, SPEC.num_actions)) < 0.6
    mask[:, 0] = True
    return torch.from_numpy(rng.random((rows, *SPEC.observation_shape)).astype(np.float32)), torch.from_numpy(mask)


def _outputs(net: ActorCritic) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        logits, value = net(*_inputs())
    return logits.numpy(), value.numpy()


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in dst.iterdir():
        path.chmod(0o644)
    return dst


def _rewrite_manifest(directory: Path, edit) -> None:
    """Apply `edit` to the manifest and rehash whatever it lists, as a careful forger would."""
    manifest = json.loads((directory / MANIFEST_NAME).read_bytes())
    edit(manifest)
    manifest["files"] = {name: sha256_hex((directory / name).read_bytes()) for name in manifest["files"]}
    (directory / MANIFEST_NAME).write_bytes(canonical_json(manifest))


@pytest.fixture
def saved(tmp_path: Path):
    net = _net()
    return net, save_snapshot(net, SPEC, CONFIG, tmp_path / "snap", LINEAGE)


# ------------------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("config", [CONFIG, NetConfig(kind="conv", channels=(4,), hidden=(16,), shared_trunk=True),
                                    NetConfig(hidden=(8,), activation="relu", shared_trunk=True)])
def test_round_trip_gives_the_same_outputs(tmp_path, config):
    net = _net(config)
    ref = save_snapshot(net, SPEC, config, tmp_path / "snap", LINEAGE)
    loaded = load_snapshot(ref.path, expect_game="connect_four")
    for want, got in zip(_outputs(net), _outputs(loaded.net)):
        np.testing.assert_array_equal(want, got)
    assert loaded.net_config == config and loaded.spec == SPEC and loaded.manifest.lineage == LINEAGE
    assert loaded.ref == ref and loaded.manifest.kind == "actor_critic" and not loaded.net.training


def test_state_dict_round_trip_and_policy(tmp_path):
    net = _net()
    ref = save_snapshot(net.state_dict(), SPEC, CONFIG, tmp_path / "snap")
    policy = policy_from_snapshot(ref.path, expect_game="connect_four")
    assert isinstance(policy, TorchPolicy)
    obs, mask = _inputs()
    batch = ActBatch(obs.numpy(), mask.numpy(), np.zeros(len(mask), np.int64))
    np.testing.assert_array_equal(policy.act(batch, np.random.default_rng(0)).actions,
                                  TorchPolicy(net).act(batch, np.random.default_rng(0)).actions)


def test_manifest_holds_the_documented_record(saved):
    _, ref = saved
    manifest = json.loads((ref.path / MANIFEST_NAME).read_bytes())
    assert set(manifest) == {"format_version", "game", "game_id", "kind", "architecture", "lineage", "files"}
    assert manifest["format_version"] == 1 and manifest["game_id"] == "connect_four"
    assert GameSpec.from_json(manifest["game"]) == SPEC and NetConfig.from_json(manifest["architecture"]) == CONFIG
    assert manifest["lineage"] == {"parent": None, "role": "main", "steps": 1000, "created_by": "test"}
    assert manifest["files"] == {WEIGHTS_NAME: sha256_hex((ref.path / WEIGHTS_NAME).read_bytes())}
    assert sorted(os.listdir(ref.path.parent)) == ["snap"]  # no temporary directory left behind


# ------------------------------------------------------------------------------------------ ids

def test_id_is_the_documented_hash_and_stable_across_locations(tmp_path, saved):
    net, ref = saved
    files = {name: sha256_hex((ref.path / name).read_bytes()) for name in (MANIFEST_NAME, WEIGHTS_NAME)}
    assert ref.snapshot_id == sha256_hex(canonical_json(sorted([n, h] for n, h in files.items())))
    elsewhere = save_snapshot(net, SPEC, CONFIG, tmp_path / "deeper" / "other", LINEAGE)
    assert elsewhere.snapshot_id == ref.snapshot_id == verify_snapshot(ref.path).snapshot_id
    copied = shutil.copytree(ref.path, tmp_path / "copied")
    assert verify_snapshot(copied).snapshot_id == ref.snapshot_id


def test_id_changes_with_weights_or_lineage(tmp_path, saved):
    net, ref = saved
    child = save_snapshot(net, SPEC, CONFIG, tmp_path / "child", Lineage(parent=ref.snapshot_id, role="main"))
    other = save_snapshot(_net(seed=1), SPEC, CONFIG, tmp_path / "other", LINEAGE)
    assert len({ref.snapshot_id, child.snapshot_id, other.snapshot_id}) == 3
    assert load_snapshot(child.path).manifest.lineage.parent == ref.snapshot_id


# -------------------------------------------------------------------------------------- immutability

def test_learner_updates_after_saving_do_not_reach_the_snapshot(saved):
    net, ref = saved
    before = _outputs(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    loaded = load_snapshot(ref.path)
    np.testing.assert_array_equal(_outputs(loaded.net)[0], before[0])
    assert not np.array_equal(_outputs(net)[0], before[0])


def test_files_are_read_only_and_overwriting_is_refused(saved):
    net, ref = saved
    for name in (MANIFEST_NAME, WEIGHTS_NAME):
        assert stat.S_IMODE((ref.path / name).stat().st_mode) & 0o222 == 0
    assert save_snapshot(net, SPEC, CONFIG, ref.path, LINEAGE) == ref  # same content: a no-op
    with pytest.raises(SnapshotError, match="already exists with other content"):
        save_snapshot(_net(seed=1), SPEC, CONFIG, ref.path, LINEAGE)
    with pytest.raises(SnapshotError, match="already exists with other content"):
        save_snapshot(net, SPEC, CONFIG, ref.path, Lineage(role="other"))
    assert verify_snapshot(ref.path) == ref


def test_saving_into_an_empty_directory_works(tmp_path):
    (tmp_path / "empty").mkdir()
    ref = save_snapshot(_net(), SPEC, CONFIG, tmp_path / "empty")
    assert verify_snapshot(tmp_path / "empty").snapshot_id == ref.snapshot_id


def test_save_refuses_weights_that_do_not_fit(tmp_path):
    with pytest.raises(SnapshotError, match="do not match the architecture"):
        save_snapshot(_net().state_dict(), SPEC, NetConfig(hidden=(64,)), tmp_path / "snap")
    assert not (tmp_path / "snap").exists()


# ------------------------------------------------------------------------------------------ refusals

def _missing_manifest(d: Path) -> None:
    (d / MANIFEST_NAME).unlink()


def _malformed_json(d: Path) -> None:
    (d / MANIFEST_NAME).write_text("{not json")


def _manifest_missing_key(d: Path) -> None:
    manifest = json.loads((d / MANIFEST_NAME).read_bytes())
    del manifest["lineage"]
    (d / MANIFEST_NAME).write_bytes(canonical_json(manifest))


def _future_version(d: Path) -> None:
    _rewrite_manifest(d, lambda m: m.update(format_version=2))


def _truncated_weights(d: Path) -> None:
    data = (d / WEIGHTS_NAME).read_bytes()
    (d / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    _rewrite_manifest(d, lambda m: None)


def _garbage_weights(d: Path) -> None:
    (d / WEIGHTS_NAME).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    _rewrite_manifest(d, lambda m: None)


def _flipped_byte(d: Path) -> None:
    data = bytearray((d / WEIGHTS_NAME).read_bytes())
    data[-1] ^= 0xFF
    (d / WEIGHTS_NAME).write_bytes(bytes(data))


def _missing_weights(d: Path) -> None:
    (d / WEIGHTS_NAME).unlink()


def _other_architecture(d: Path) -> None:
    _rewrite_manifest(d, lambda m: m.update(architecture=NetConfig(hidden=(64,)).to_json()))


def _unknown_architecture_kind(d: Path) -> None:
    _rewrite_manifest(d, lambda m: m["architecture"].update(kind="transformer"))


def _unknown_policy_head(d: Path) -> None:
    _rewrite_manifest(d, lambda m: m["architecture"].update(head=["regret_matching"]))


def _path_escape(d: Path) -> None:
    _rewrite_manifest(d, lambda m: None)
    manifest = json.loads((d / MANIFEST_NAME).read_bytes())
    manifest["files"]["../secret"] = "0" * 64
    (d / MANIFEST_NAME).write_bytes(canonical_json(manifest))


def _symlinked_weights(d: Path) -> None:
    target = d.parent / "elsewhere.safetensors"
    shutil.copy(d / WEIGHTS_NAME, target)
    (d / WEIGHTS_NAME).unlink()
    (d / WEIGHTS_NAME).symlink_to(target)


@pytest.mark.parametrize("damage,message", [
    (_missing_manifest, "is missing the file manifest.json"),
    (_malformed_json, "malformed manifest .*not valid JSON"),
    (_manifest_missing_key, r"malformed manifest .*missing keys \['lineage'\]"),
    (_future_version, "unknown snapshot format version 2"),
    (_truncated_weights, "corrupt weights file"),
    (_garbage_weights, "corrupt weights file"),
    (_flipped_byte, "hash mismatch for .*weights.safetensors"),
    (_missing_weights, "is missing the file weights.safetensors"),
    (_other_architecture, "do not match the architecture"),
    (_unknown_architecture_kind, "bad architecture"),
    (_unknown_policy_head, "bad architecture"),
    (_path_escape, "files must map plain file names"),
    (_symlinked_weights, "symlinks are not allowed"),
])
def test_damaged_snapshots_are_refused_with_one_line(tmp_path, saved, damage, message):
    broken = _writable_copy(saved[1].path, tmp_path / "broken")
    damage(broken)
    with pytest.raises(SnapshotError, match=message) as info:
        load_snapshot(broken)
    assert "\n" not in str(info.value)


def test_a_snapshot_of_another_game_is_refused(saved):
    with pytest.raises(SnapshotError, match="plays 'connect_four', not 'tic_tac_toe'"):
        load_snapshot(saved[1].path, expect_game="tic_tac_toe")


def test_no_directory_is_refused(tmp_path):
    with pytest.raises(SnapshotError, match="no snapshot directory"):
        load_snapshot(tmp_path / "nothing")


def test_verify_catches_a_modified_file(tmp_path, saved):
    broken = _writable_copy(saved[1].path, tmp_path / "broken")
    _flipped_byte(broken)
    with pytest.raises(SnapshotError, match="hash mismatch"):
        verify_snapshot(broken)


def test_extra_files_are_hashed_and_verified(tmp_path):
    header = {"format_version": 1, "game": SPEC.to_json(), "game_id": SPEC.id, "kind": "lm",
              "architecture": {"n_layer": 2}, "lineage": Lineage().to_json()}
    ref = write_snapshot(tmp_path / "lm", header, {"weights.safetensors": b"w", "tokenizer.json": b"{}"})
    assert verify_snapshot(ref.path) == ref
    with pytest.raises(SnapshotError, match="holds a 'lm' model"):
        load_snapshot(ref.path)
    broken = _writable_copy(ref.path, tmp_path / "broken")
    (broken / "tokenizer.json").write_bytes(b"{ }")
    with pytest.raises(SnapshotError, match="hash mismatch for .*tokenizer.json"):
        verify_snapshot(broken)
