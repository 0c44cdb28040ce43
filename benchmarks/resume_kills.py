"""Exact resume under kill -9: 20 runs per case, each killed at a random moment, resumed, and compared.

Two cases, run one after the other (each ends with its own goal line):

* `connect_four` (goal resume_exact_kills): the `connect_four` preset's kind of run, scaled down:
  asynchronous (`pipeline_depth: 2`, the next iteration planned and played while this one
  learns), two runner processes, anchors, snapshots and rating matches.
* `llm_kuhn_poker` (goal resume_exact_kills_lm): the `llm_kuhn_poker` preset with turn-level PPO
  (`learner: text_ppo`) on the tests' tiny random Llama (SmolLM2's tokenizer and chat template,
  tests/conftest.py), scaled down to ~20 s: sampled generation in the manager's process, LoRA
  adapters and their Adam states, the `base` anchor and adapter snapshots.

One uninterrupted run is each case's reference. Each trial starts the same run, kills the manager
and its runners (SIGKILL to the process group) at a random moment — while the run is being
created, or a random delay after a random iteration's checkpoint, so the kill lands in planning,
play, learning, snapshotting, checkpointing or the closing rating round — runs `ludus resume` to
the end, and counts as exact when every ledger row (seq, id, seed, moves, returns, ratings
history), every snapshot file (the LM's adapters included) and the final checkpoint's learner
tensors (weights, optimizer and sampler states) equal the reference's.

    python benchmarks/resume_kills.py [--cases connect_four llm_kuhn_poker] [--trials 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
ITERATIONS = 10
ASYNC = ["game=connect_four", "pipeline_depth=2", "backend=process", "num_runners=2", f"iterations={ITERATIONS}",
         "matches_per_iteration=32", "num_envs=16", "snapshot_every_steps=300", "anchors=[random]",
         "net.hidden=[32]", "ppo.num_minibatches=2", "ppo.update_epochs=2", "rating_share=0.2",
         "log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]
LM_ITERATIONS = 8
LM = ["learner=text_ppo", f"iterations={LM_ITERATIONS}", "matches_per_iteration=24", "num_envs=24",
      "snapshot_every_steps=20", "text_lm.ppo.minibatch_size=64", "text_lm.ppo.micro_batch_size=32",
      "log.progress=false", "log.wandb=disabled", "log.tensorboard=false"]
"""With `text_lm.model.base=<the tiny Llama>` added (`lm_overrides`)."""


@dataclass(frozen=True)
class Case:
    """A run to kill, and where its kills are drawn from."""

    goal: str
    preset: str
    iterations: int
    creation: tuple[float, float]
    """Seconds after the start for a kill while the run is being created (or loaded)."""
    first_iteration: int
    """Kills after an iteration's checkpoint pick one of first_iteration .. iterations - 2."""
    delay: tuple[float, float]
    """Seconds after that checkpoint."""
    lm: bool = False
    """Trained on the tiny random Llama (`lm_overrides`)."""


CASES = {
    "connect_four": Case("resume_exact_kills", "quickstart", ITERATIONS, (0.5, 4.0), 1, (0.0, 0.6)),
    # Measured here: ~3 s to import torch, ~8 s until the run's first checkpoint (the creation
    # kills land in imports, loading the base and tokenizer, founding and the first snapshot),
    # then ~1-1.5 s an iteration (0.8-1.3 s play, 0.3 s learning), so a delay of up to 1.5 s
    # lands anywhere in the next iteration, and after the last but one also in the closing round.
    "llm_kuhn_poker": Case("resume_exact_kills_lm", "llm_kuhn_poker", LM_ITERATIONS, (0.5, 8.0), 0, (0.0, 1.5),
                           lm=True),
}


def tiny_llama(directory: Path) -> Path:
    """The tests' tiny random Llama (tests/conftest.py `tiny_bases`, seed 0) with SmolLM2's tokenizer."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import _tiny_llama  # noqa: E402  (the one definition of the tiny model)
    from transformers import AutoTokenizer

    from ludus.agents.lm.pretrained import base_model_dir

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir("smollm2-135m-instruct"), local_files_only=True)
    return _tiny_llama(directory, tokenizer, 0)


def lm_overrides(base: Path) -> list[str]:
    return [*LM, f"text_lm.model.base={base}"]


def train_args(run_dir: Path, overrides: list[str], preset: str = "quickstart") -> list[str]:
    args = ["train", preset, "--run", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    return args


def checkpointed_iteration(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "checkpoint.json").read_text())["iteration"]
    except (OSError, ValueError, KeyError):
        return -1


def run_with_kills(run_dir: Path, overrides: list[str], kills: list[tuple[int, float]],
                   preset: str = "quickstart") -> int:
    """Train, and kill -9 the manager and its runners once per (iteration, delay) of `kills`: `delay`
    seconds after the run's checkpoint reaches `iteration` (-1: after the start, i.e. during the
    run's creation or loading); then resume until finished. Returns how many kills landed."""
    landed = 0
    pending = list(kills)
    while True:
        resuming = (run_dir / "checkpoint.json").exists()
        args = ["resume", str(run_dir)] if resuming else train_args(run_dir, overrides, preset)
        proc = subprocess.Popen([sys.executable, "-m", "ludus", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=ENV, start_new_session=True)
        if pending:
            iteration, delay = pending.pop(0)
            while proc.poll() is None and checkpointed_iteration(run_dir) < iteration:
                time.sleep(0.01)
            time.sleep(delay)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the manager and its runner processes
                proc.wait()
                landed += 1
                continue
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(err.decode().strip())
        if not pending:
            return landed


def ledger_rows(run_dir: Path) -> list[tuple]:
    """The ledger without wall-clock fields, and the ratings history (`Store.comparable_rows`)."""
    from ludus.league.records.ledger import Store

    with Store.open(run_dir, mode="read") as store:
        return store.comparable_rows()


def snapshot_ids(run_dir: Path) -> dict[str, str]:
    return {m.parent.name: hashlib.sha256(m.read_bytes()).hexdigest()
            for m in sorted((run_dir / "snapshots").glob("*/manifest.json"))}


def file_hashes(directory: Path, pattern: str) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.glob(pattern)) if p.is_file()}


def fingerprint(run_dir: Path) -> dict[str, object]:
    """What a resumed run must share with the uninterrupted one: the ledger, every file of every
    snapshot (the manifests name their files' hashes; the files are hashed too, so an LM's
    adapters are compared directly), and the learners' tensors in the final checkpoint (weights,
    optimizer moments, sampler states: what a further `resume --iterations` would start from)."""
    final = run_dir / json.loads((run_dir / "checkpoint.json").read_text())["path"]
    return {"ledger": ledger_rows(run_dir), "snapshots": file_hashes(run_dir / "snapshots", "*/*"),
            "learners": file_hashes(final, "learner-*.safetensors")}


def difference(found: dict[str, object], expected: dict[str, object]) -> str:
    """Which parts of a fingerprint differ, with the first differing ledger row or files."""
    parts = []
    for part in expected:
        a, b = found[part], expected[part]
        if a == b:
            continue
        if isinstance(b, list):
            row = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            parts.append(f"ledger from row {row} ({len(a)} rows vs {len(b)})")
        else:
            names = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            parts.append(f"{part} {names[:3]}{' ...' if len(names) > 3 else ''}")
    return "; ".join(parts)


def random_kill(rng: np.random.Generator, case: Case) -> tuple[int, float]:
    """While being created (one time in five), else a random delay after a random iteration."""
    if rng.random() < 0.2:
        return -1, float(rng.uniform(*case.creation))
    return int(rng.integers(case.first_iteration, case.iterations - 1)), float(rng.uniform(*case.delay))


def run_case(name: str, case: Case, trials: int, seed: int, tmp: Path) -> bool:
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    overrides = lm_overrides(tiny_llama(tmp / "tiny-llama")) if case.lm else ASYNC
    reference = tmp / f"{name}-reference"
    begun = time.perf_counter()
    run_with_kills(reference, overrides, [], case.preset)
    once = time.perf_counter() - begun
    expected = fingerprint(reference)
    exact = landed = 0
    for trial in range(trials):
        run = tmp / f"{name}-trial-{trial}"
        kill = random_kill(rng, case)
        landed += run_with_kills(run, overrides, [kill], case.preset)
        differs = difference(fingerprint(run), expected)
        exact += not differs
        where = f"{kill[1]:.2f} s after the start" if kill[0] < 0 else f"{kill[1]:.2f} s after iteration {kill[0]}"
        print(f"{name} trial {trial + 1:2d}: killed {where}: {'exact' if not differs else 'DIFFERENT: ' + differs}",
              flush=True)
        shutil.rmtree(run, ignore_errors=True)
    print(f"{name}: {landed} of {trials} kills landed before the run finished; {len(expected['ledger'])} ledger rows, "
          f"{len(expected['snapshots'])} snapshot files, {len(expected['learners'])} learner states; "
          f"uninterrupted run {once:.0f} s; {time.perf_counter() - started:.0f} s in all")
    print(f"goal {case.goal}: {exact}/{trials} (target {trials}/{trials}) {'PASS' if exact == trials else 'FAIL'}",
          flush=True)
    return exact == trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ludus-kills-") as tmp:
        for name in args.cases:
            run_case(name, CASES[name], args.trials, args.seed, Path(tmp))


if __name__ == "__main__":
    main()
