"""Test-wide settings.

Under LUDUS_CI=1 (set by .ci/run) a test that skips fails the run unless it is on
SKIP_ALLOWLIST: CI must never pass by quietly not testing something.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")

# Node ids (prefixes) allowed to skip in CI, each with the reason.
SKIP_ALLOWLIST: dict[str, str] = {}

_disallowed_skips: list[str] = []


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
