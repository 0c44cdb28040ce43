"""The language models' snapshot kinds: "lm" (a whole causal LM with its value head and tokenizer
files) and "lm_adapter" (LoRA adapters and a value head on a pretrained base, named by content
hash), saved and loaded in the snapshot format of agents/snapshot.py, whose table of kinds
(`SNAPSHOT_KINDS`) reaches this module by path (`lm_policy`; text_policy.py for "lm_adapter")."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from ludus.agents.lm.generation import LMPolicy
from ludus.agents.lm.model import LMError, lm_from_snapshot_files, lm_state_for_snapshot
from ludus.agents.lm.pretrained import (ADAPTER_FORMAT, BASE_MODELS, LoRAConfig, PretrainedLMConfig,
                                        adapter_architecture, base_content_hash, base_model_dir, load_pretrained_lm,
                                        restore_adapters, trained_state)
from ludus.agents.policy import Policy
from ludus.agents.snapshot import (ADAPTER_WEIGHTS_NAME, FORMAT_VERSION, KIND_LM, KIND_LM_ADAPTER, MANIFEST_NAME,
                                   WEIGHTS_NAME, Lineage, SnapshotError, SnapshotManifest, SnapshotRef, read_verified,
                                   read_verified_files, write_snapshot)
from ludus.games.core import GameSpec


# ------------------------------------------------------------------------------- "lm" snapshots
#
# Kind "lm": a causal language model with a value head (agents/lm/model.py). The architecture record is
# `ludus.agents.lm.model.lm_state_for_snapshot(...).architecture` ({"format", "hf_config"}: JSON only, no code
# from anywhere runs), the weights are weights.safetensors, and a pretrained model's tokenizer
# JSON/text files are extra files. The model reads the game's token ids (Vocabulary: <pad> = id 0).


@dataclass(frozen=True)
class LoadedLMSnapshot:
    """A verified "lm" snapshot with its model rebuilt."""

    ref: SnapshotRef
    manifest: SnapshotManifest
    lm: Any
    """A `ludus.agents.lm.model.LoadedLM`: the LMWithValueHead in eval mode, and its tokenizer (or None)."""

    @property
    def spec(self) -> GameSpec:
        return self.manifest.game


def save_lm_snapshot(model: Any, spec: GameSpec, directory: str | os.PathLike, lineage: Lineage = Lineage(),
                     tokenizer: Any | None = None) -> SnapshotRef:
    """Freeze a `ludus.agents.lm.model.LMWithValueHead` (and optionally its tokenizer) as a kind "lm" snapshot."""
    from safetensors.torch import save as safetensors_bytes

    parts = lm_state_for_snapshot(model, tokenizer)
    if model.vocab_size < spec.num_actions:
        raise SnapshotError(f"save_lm_snapshot: the model has {model.vocab_size} tokens, the game "
                            f"{spec.id!r} has {spec.num_actions} actions")
    header = {
        "format_version": FORMAT_VERSION,
        "game": spec.to_json(),
        "game_id": spec.id,
        "kind": KIND_LM,
        "architecture": parts.architecture,
        "lineage": lineage.to_json(),
    }
    return write_snapshot(directory, header, {WEIGHTS_NAME: safetensors_bytes(parts.tensors), **parts.extra_files})


def load_lm_snapshot(path: str | os.PathLike, expect_game: str | None = None) -> LoadedLMSnapshot:
    """Verify the "lm" snapshot at `path` and rebuild its model (JSON + safetensors + tokenizer
    JSON/text only, never pickle). `expect_game`: refuse a snapshot of any other game id."""
    # every file re-hashed, keeping the bytes that were hashed (the weights and the tokenizer files)
    ref, manifest, contents = read_verified_files(path, KIND_LM, expect_game)
    directory = ref.path

    from safetensors import SafetensorError
    from safetensors.torch import load as safetensors_load

    try:
        tensors = safetensors_load(contents.pop(WEIGHTS_NAME))
    except (SafetensorError, ValueError, TypeError, RuntimeError) as exc:
        raise SnapshotError(f"corrupt weights file {directory / WEIGHTS_NAME}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    try:
        lm = lm_from_snapshot_files(manifest.architecture, tensors, contents)
    except LMError as exc:
        raise SnapshotError(f"snapshot {directory}: {exc}") from None
    if lm.model.vocab_size < manifest.game.num_actions:
        raise SnapshotError(f"snapshot {directory}: the model has {lm.model.vocab_size} tokens, the game "
                            f"{manifest.game_id!r} has {manifest.game.num_actions} actions")
    return LoadedLMSnapshot(ref, manifest, lm)


def lm_policy(path: str | os.PathLike, expect_game: str | None, lm_base: Any | None) -> Policy:
    """The `SnapshotKind.policy` of kind "lm": an LMPolicy on the snapshot's model (token games: it
    reads the game's token ids, padding id 0)."""
    return LMPolicy(load_lm_snapshot(path, expect_game).lm.model, pad_id=0)


# ----------------------------------------------------------------------- "lm_adapter" snapshots
#
# Kind "lm_adapter": what training changed on a pretrained base (agents/lm/pretrained.py): LoRA
# adapters and the value head as adapter.safetensors, and an architecture record naming the base
# by content hash (and by id when the host ships it) and the adapters' config. A few MB instead of
# the whole model; it loads only onto the base whose hash it records.


@dataclass(frozen=True)
class LoadedAdapterSnapshot:
    """A verified "lm_adapter" snapshot restored onto its base."""

    ref: SnapshotRef
    manifest: SnapshotManifest
    lm: Any
    """A `ludus.agents.lm.pretrained.PretrainedLM` with the snapshot's adapters and value head."""


def save_adapter_snapshot(lm: Any, spec: GameSpec, directory: str | os.PathLike,
                          lineage: Lineage = Lineage(), play: Mapping[str, Any] | None = None) -> SnapshotRef:
    """Freeze the adapters and value head of a `ludus.agents.lm.pretrained.PretrainedLM` as kind "lm_adapter".

    `play`: how the LM plays text games (`ludus.agents.lm.text_policy.TextPlayConfig.to_json()`), stored so
    that the snapshot plays the same way wherever it is loaded."""
    from safetensors.torch import save as safetensors_bytes

    architecture = adapter_architecture(lm)
    if play is not None:
        architecture["play"] = dict(play)
    header = {"format_version": FORMAT_VERSION, "game": spec.to_json(), "game_id": spec.id,
              "kind": KIND_LM_ADAPTER, "architecture": architecture, "lineage": lineage.to_json()}
    return write_snapshot(directory, header, {ADAPTER_WEIGHTS_NAME: safetensors_bytes(trained_state(lm.model))})


@dataclass(frozen=True)
class AdapterSnapshotRecord:
    """A verified "lm_adapter" snapshot read from disk, not yet put onto a model."""

    ref: SnapshotRef
    manifest: SnapshotManifest
    base: Any
    """The `ludus.agents.lm.pretrained.PretrainedLMConfig` to load it onto (base and the snapshot's adapters)."""
    tensors: dict[str, torch.Tensor]
    """Adapter and value-head tensors."""

    @property
    def play(self) -> dict | None:
        """How it plays text games (`TextPlayConfig` JSON), when the snapshot records it."""
        return self.manifest.architecture.get("play")


def read_adapter_snapshot(path: str | os.PathLike, base: Any | None = None,
                          expect_game: str | None = None) -> AdapterSnapshotRecord:
    """Verify an "lm_adapter" snapshot: files, manifest, and that `base` is the base it was trained on.

    `base`: a `ludus.agents.lm.pretrained.PretrainedLMConfig` naming the base (the operator's choice,
    e.g. a local directory); None takes the base id the snapshot records, which must be one the
    host ships (`ludus.agents.lm.pretrained.BASE_MODELS`) — a snapshot never chooses a path to read. A
    snapshot of another base (content hash) is refused with a one-line error."""
    from safetensors import SafetensorError
    from safetensors.torch import load as safetensors_load

    ref, manifest, data = read_verified(path, KIND_LM_ADAPTER, expect_game, parts=True)
    directory = ref.path
    architecture = manifest.architecture
    try:
        if architecture.get("format") != ADAPTER_FORMAT:
            raise SnapshotError(f"snapshot {directory}: not an LM adapter record (format {architecture.get('format')!r})")
        lora = LoRAConfig(**{**architecture["lora"], "target_modules": tuple(architecture["lora"]["target_modules"])})
        if base is None:
            if architecture.get("base") not in BASE_MODELS:
                raise SnapshotError(f"snapshot {directory} was trained on a local base model "
                                    f"{str(architecture.get('base'))!r:.80}: give its directory with `ludus evaluate "
                                    f"SNAPSHOT --exploitability --base DIR` (in Python: PretrainedLMConfig(base=DIR))")
            base = PretrainedLMConfig(base=architecture["base"])
        base = replace(base, lora=lora)
        base_hash = base_content_hash(base_model_dir(base.base))
        if architecture.get("base_hash") != base_hash:
            raise SnapshotError(f"snapshot {directory} was trained on base {str(architecture.get('base_hash'))[:12]} "
                                f"({architecture.get('base') or 'a local directory'}); this base is {base_hash[:12]} "
                                f"({base.base}): load it onto the base it was trained on")
        tensors = safetensors_load(data)
    except SnapshotError:
        raise
    except (KeyError, TypeError) as exc:
        raise SnapshotError(f"malformed manifest {directory / MANIFEST_NAME}: bad adapter record ({exc})") from None
    except (SafetensorError, ValueError, RuntimeError) as exc:
        if isinstance(exc, LMError):
            raise SnapshotError(str(exc)) from None
        raise SnapshotError(f"corrupt adapter file {directory / ADAPTER_WEIGHTS_NAME}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    return AdapterSnapshotRecord(ref, manifest, base, tensors)


def load_adapter_snapshot(path: str | os.PathLike, base: Any | None = None,
                          expect_game: str | None = None) -> LoadedAdapterSnapshot:
    """Verify an "lm_adapter" snapshot (`read_adapter_snapshot`) and restore it onto a fresh copy of its base."""
    record = read_adapter_snapshot(path, base, expect_game)
    try:
        lm = load_pretrained_lm(record.base)
        restore_adapters(lm, record.manifest.architecture, record.tensors, f"snapshot {record.ref.path}")
    except LMError as exc:
        raise SnapshotError(str(exc)) from None
    return LoadedAdapterSnapshot(record.ref, record.manifest, lm)
