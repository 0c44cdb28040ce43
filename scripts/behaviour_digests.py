"""Digests of seeded short runs: what a refactor must leave unchanged, to the byte.

Each case is a preset scaled to seconds, trained from its seed on the serial backend. Its digest is
the SHA-256 of the ledger without wall-clock fields and the ratings history
(`Store.comparable_rows`), and of every file of every snapshot. Recording before a change and
checking after it shows that the change moved code and not behaviour:

    python scripts/behaviour_digests.py --record scripts/behaviour_digests.json   # before
    python scripts/behaviour_digests.py --check scripts/behaviour_digests.json    # after

`--check` prints one line a case (recorded digest, digest now, `same` or `DIFFERENT`) and exits 1
if any case differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUIET = ["log.progress=false", "log.wandb=disabled", "log.tensorboard=false", "backend=serial"]


@dataclass(frozen=True)
class Case:
    """A seeded short run: a preset and the overrides that make it take seconds."""

    name: str
    preset: str
    overrides: tuple[str, ...] = ()
    lm: bool = False
    """Trained on the tiny random Llama (`text_lm.model.base` is set to it)."""


CASES = (
    Case("quickstart", "quickstart", ("iterations=4",)),  # the preset trains 30 iterations to learn
    Case("connect_four", "connect_four", ("iterations=6", "matches_per_iteration=32", "num_envs=16")),
    Case("kuhn_poker", "kuhn_poker", ("iterations=3",)),
    Case("leduc_poker", "leduc_poker", ("iterations=2",)),
    Case("simple_tag", "simple_tag", ("iterations=3",)),
    Case("negotiation", "negotiation", ("iterations=2",)),
    Case("llm_kuhn_poker", "llm_kuhn_poker",
         ("learner=text_ppo", "iterations=2", "matches_per_iteration=24", "num_envs=24",
          "text_lm.ppo.minibatch_size=64", "text_lm.ppo.micro_batch_size=32"), lm=True),
)


def tiny_llama(directory: Path) -> Path:
    """The tests' tiny random Llama (tests/conftest.py `tiny_bases`, seed 0) with SmolLM2's tokenizer."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import _tiny_llama  # noqa: E402  (the one definition of the tiny model)
    from transformers import AutoTokenizer

    from ludus.agents.lm.pretrained import base_model_dir

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir("smollm2-135m-instruct"), local_files_only=True)
    return _tiny_llama(directory, tokenizer, 0)


def run_digest(case: Case, root: Path, lm_base: Path | None) -> tuple[str, float]:
    run = root / case.name
    overrides = [*QUIET, *case.overrides]
    if case.lm:
        overrides.append(f"text_lm.model.base={lm_base}")
    args = [sys.executable, "-m", "ludus", "train", case.preset, "--run", str(run)]
    for item in overrides:
        args += ["--set", item]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{case.name}: `ludus train` failed: {done.stderr.decode().strip().splitlines()[-1:]}")
    seconds = time.perf_counter() - started
    from ludus.league.records.ledger import Store

    digest = hashlib.sha256()
    with Store.open(run, mode="read") as store:
        digest.update(json.dumps(store.comparable_rows()).encode())
    for path in sorted((run / "snapshots").rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(run)).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest(), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, help="write the digests to this JSON file")
    mode.add_argument("--check", type=Path, help="compare with the digests in this JSON file")
    parser.add_argument("--cases", nargs="*", default=[c.name for c in CASES], help="a subset of the cases")
    args = parser.parse_args()
    known = {c.name: c for c in CASES}
    unknown = sorted(set(args.cases) - set(known))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; the cases are {sorted(known)}")
    recorded = json.loads(args.check.read_text()) if args.check else {}
    now: dict[str, str] = {}
    differ = 0
    with tempfile.TemporaryDirectory(prefix="ludus-digests-") as tmp:
        root = Path(tmp)
        lm_base = tiny_llama(root / "tiny-llama") if any(known[n].lm for n in args.cases) else None
        for name in args.cases:
            digest, seconds = run_digest(known[name], root, lm_base)
            now[name] = digest
            if args.check:
                before = recorded.get(name, "-")
                verdict = "same" if before == digest else "DIFFERENT"
                differ += verdict != "same"
                print(f"{name:16s} recorded {before[:16]}  now {digest[:16]}  {verdict}  ({seconds:.0f} s)", flush=True)
            else:
                print(f"{name:16s} {digest}  ({seconds:.0f} s)", flush=True)
    if args.record:
        args.record.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n")
        print(f"recorded {len(now)} digests in {args.record}")
    elif differ:
        raise SystemExit(f"{differ} of {len(now)} cases differ")
    else:
        print(f"all {len(now)} cases the same")


if __name__ == "__main__":
    main()
