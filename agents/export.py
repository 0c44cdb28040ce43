"""Export a snapshot's actor-critic for use outside Ludus: TorchScript or ONNX; and a mixture
checkpoint (a league's output policy, agents/mixture.py) as its members plus their weights.

The exported model has inputs ``obs`` [N, *observation_shape] (the game's observation dtype) and
``mask`` [N, A] bool, outputs ``logits`` [N, A] (illegal actions at -1e9; with a 'regret_matching'
head also legal actions without positive regret) and ``value`` [N], with a dynamic batch
dimension. Every export is checked by running the exported file on random observations and masks
and comparing with the torch net (ONNX: `onnx.checker` plus the pure-Python
`onnx.reference.ReferenceEvaluator`, so onnxruntime is not needed).
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ludus.agents.nets import ActorCritic
from ludus.agents.snapshot import load_snapshot
from ludus.games.core import GameSpec
from ludus.errors import UserError
from ludus.text import safe_file_name

FORMATS = ("torchscript", "onnx")
VERIFY_ROWS = 16
"""Random rows the export is checked on (and the batch size used while tracing)."""
TOLERANCE = 1e-4
"""Largest absolute difference from the torch net accepted (float32 reassociation error is ~1e-6)."""


class ExportError(UserError, ValueError):
    """A bad export request or an exported model that does not reproduce the net."""


@dataclass(frozen=True)
class ExportReport:
    """What `export_net` wrote and how closely it reproduces the torch net."""

    path: Path
    """The exported file."""
    format: str
    """'torchscript' or 'onnx'."""
    max_abs_diff_logits: float
    """Largest |exported - torch| over the legal logits of the check rows."""
    max_abs_diff_value: float
    """Largest |exported - torch| over the values of the check rows."""


def example_inputs(spec: GameSpec, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random observations (in [0, 1), or small ints for integer observations) and random non-empty masks."""
    shape = (rows, *spec.observation_shape)
    if np.issubdtype(np.dtype(spec.observation_dtype), np.integer):
        obs = rng.integers(0, 2, size=shape).astype(spec.observation_dtype)
    else:
        obs = rng.random(shape).astype(spec.observation_dtype)
    mask = rng.random((rows, spec.num_actions)) < 0.6
    mask[np.arange(rows), rng.integers(0, spec.num_actions, size=rows)] = True
    return obs, mask


def _write_torchscript(net: ActorCritic, obs: torch.Tensor, mask: torch.Tensor, out: Path) -> None:
    with warnings.catch_warnings():
        # torch 2.x marks torch.jit deprecated, but TorchScript is still the format C++ (libtorch) loads.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..* is deprecated")
        traced = torch.jit.trace(net, (obs, mask))
        traced.save(str(out))


def _run_torchscript(path: Path, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..* is deprecated")
        module = torch.jit.load(str(path))  # the file we just wrote, not a stranger's
    with torch.inference_mode():
        logits, value = module(torch.from_numpy(obs), torch.from_numpy(mask))
    return logits.numpy(), value.numpy()


def _write_onnx(net: ActorCritic, obs: torch.Tensor, mask: torch.Tensor, out: Path) -> None:
    batch = torch.export.Dim("batch", min=1)
    # The exporter logs that torchvision ops are absent and warns about its own internals; none of
    # it concerns this net, so it is silenced for the duration of the export only.
    registration_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration_log.level
    registration_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r".*The axis name: batch will not be used", category=UserWarning)
            torch.onnx.export(net, (obs, mask), str(out), input_names=["obs", "mask"],
                              output_names=["logits", "value"], dynamic_shapes={"obs": {0: batch}, "mask": {0: batch}},
                              dynamo=True, verbose=False, external_data=False)  # one file: weights inside
    finally:
        registration_log.setLevel(level)


def _run_onnx(path: Path, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    logits, value = ReferenceEvaluator(model).run(None, {"obs": obs, "mask": mask})
    return np.asarray(logits), np.asarray(value)


def run_exported(path: str | os.PathLike, fmt: str, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logits, value) of an exported model on one batch."""
    if fmt == "torchscript":
        return _run_torchscript(Path(path), obs, mask)
    if fmt == "onnx":
        return _run_onnx(Path(path), obs, mask)
    raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")


def export_net(net: ActorCritic, fmt: str, out: str | os.PathLike, seed: int = 0) -> ExportReport:
    """Write `net` as `fmt` to `out`, then check the file reproduces the net on random rows."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    out = Path(out)
    if out.is_dir():
        raise ExportError(f"--out {out} is a directory: give a file name, e.g. {out / ('model.' + fmt[:4])}")
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    trace_obs, trace_mask = example_inputs(net.spec, VERIFY_ROWS, rng)
    with torch.no_grad():
        if fmt == "torchscript":
            _write_torchscript(net, torch.from_numpy(trace_obs), torch.from_numpy(trace_mask), out)
        else:
            _write_onnx(net, torch.from_numpy(trace_obs), torch.from_numpy(trace_mask), out)
    # Check on other rows and another batch size than the ones used while tracing.
    obs, mask = example_inputs(net.spec, VERIFY_ROWS + 3, rng)
    with torch.inference_mode():
        want_logits, want_value = (t.numpy() for t in net(torch.from_numpy(obs), torch.from_numpy(mask)))
    got_logits, got_value = run_exported(out, fmt, obs, mask)
    if got_logits.shape != want_logits.shape or got_value.shape != want_value.shape:
        raise ExportError(f"exported {fmt} model gives shapes {got_logits.shape}, {got_value.shape}; "
                          f"the net gives {want_logits.shape}, {want_value.shape}")
    report = ExportReport(out, fmt, float(np.abs(got_logits - want_logits)[mask].max()),
                          float(np.abs(got_value - want_value).max()))
    # the net's own zeros: illegal actions, and for a regret-matching head legal ones without positive regret
    if not np.array_equal(got_logits <= -1e8, want_logits <= -1e8):
        raise ExportError(f"exported {fmt} model does not mask the same actions as the net")
    if max(report.max_abs_diff_logits, report.max_abs_diff_value) > TOLERANCE:
        raise ExportError(f"exported {fmt} model differs from the net by up to "
                          f"{max(report.max_abs_diff_logits, report.max_abs_diff_value):.2e} (> {TOLERANCE})")
    return report


def export_snapshot(snapshot: str | os.PathLike, fmt: str, out: str | os.PathLike) -> ExportReport:
    """Export the net of the snapshot at `snapshot` (verified on load) to `out`."""
    return export_net(load_snapshot(snapshot).net, fmt, out)


MIXTURE_FORMAT = "mixture"
"""`export_mixture` format: a self-contained mixture checkpoint (the member snapshots copied in)."""
MEMBERS_FILE = "members.json"


def export_mixture(mixture_dir: str | os.PathLike, fmt: str, out: str | os.PathLike) -> list[Path]:
    """Export a mixture checkpoint into the new directory `out`; returns the files written.

    ``mixture``: the member snapshots copied to ``out/members/<player id>`` and a ``mixture.json``
    pointing at them, so the folder stands alone (an arena submission, a copy to another machine).
    ``torchscript``/``onnx``: each snapshot member exported and checked as `export_net` does, plus
    ``members.json`` with each member's weight and file (bots by name)."""
    import json
    import shutil
    from dataclasses import replace

    from ludus.agents.mixture import component_paths, read_mixture, write_mixture

    if fmt not in (*FORMATS, MIXTURE_FORMAT):
        raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join((*FORMATS, MIXTURE_FORMAT))}")
    mixture = read_mixture(mixture_dir)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out} exists and is not an empty directory: a mixture exports into a new one")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    components, entries = [], []
    for component, path in zip(mixture.components, component_paths(mixture_dir, mixture)):
        entry = {"player_id": component.player_id, "weight": component.weight}
        if path is None:
            components.append(component)
            entries.append({**entry, "bot": component.bot})
            continue
        name = safe_file_name(component.player_id)
        if fmt == MIXTURE_FORMAT:
            shutil.copytree(path, out / "members" / name)
            components.append(replace(component, snapshot=f"members/{name}"))
        else:
            target = out / f"{name}.{'pt' if fmt == 'torchscript' else 'onnx'}"
            written.append(export_net(load_snapshot(path).net, fmt, target).path)
            entries.append({**entry, "file": target.name})
    if fmt == MIXTURE_FORMAT:
        written.append(write_mixture(out, replace(mixture, components=tuple(components))))
        read_mixture(out)  # the copy checks out on its own
    else:
        members = out / MEMBERS_FILE
        members.write_text(json.dumps({"game_id": mixture.game_id, "source": mixture.source, "format": fmt,
                                       "components": entries}, indent=1) + "\n")
        written.append(members)
    return written
