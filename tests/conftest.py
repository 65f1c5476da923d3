"""Shared test fixtures: the captured real data beside the checkout, and a tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared sits beside the checkout (and beside CI's clone); GPUTUNE_SHARED overrides.
SHARED = Path(os.environ.get("GPUTUNE_SHARED", REPO.parent / "shared"))
FIXTURES = SHARED / "fixtures"
LOCAL_FIXTURES = REPO / "tests" / "fixtures"


def run_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a child run from the checkout as a user without an install would (PYTHONPATH=.):
    the CLI's exit status, stdout and stderr as a real process gives them."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"the captured fixtures are missing: {FIXTURES} (set GPUTUNE_SHARED)")
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised Llama (config, safetensors, tokenizer), made once per session."""
    from tests.tinymodel import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
