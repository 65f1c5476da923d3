"""The plain parameter converters give what typer's pydantic ones give, and spare the pydantic import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main

from tests.conftest import run_python
from tuner.cli import app
from tuner.typer_compat import plain_converter

coercion = pytest.importorskip("typer._coercion", reason="this typer does not convert through pydantic")

SAMPLES: dict[str, list[Any]] = {
    "bool": [True, False, None, "yes", "Off", " 1 ", "", 0, 1, "maybe", 2, 1.5, 1.0, b"yes", b" no", [1]],
    "str": ["x", "", "a b", None, 7],
    "Path": ["/tmp/some.tar.gz", "rel/dir", "", None, Path("/x")],
    "Enum": ["json", "table", "JSON", "xml", "", None, "warn", "error", "fail", "sometimes"],
    "list": [("a", "b,c"), (), ["x"], None, "not-a-list"],
}


def _kind(param: Any) -> str:
    ann = param.type_descriptor.annotation
    if getattr(ann, "__origin__", None) is list:
        return "list"
    if isinstance(ann, type) and issubclass(ann, Path):
        return "Path"
    if ann in (bool, str):
        return ann.__name__
    return "Enum"


def _outcome(converter: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        return "ok", converter.coerce(value, param=param, ctx=ctx)
    except Exception as exc:
        return type(exc).__name__, exc.format_message() if hasattr(exc, "format_message") else str(exc)


def _params() -> list[tuple[str, Any, Any]]:
    group = typer.main.get_command(app)
    out = []
    for name, cmd in [("gputune", group), *getattr(group, "commands", {}).items()]:
        for param in cmd.params:
            if plain_converter(param.type_descriptor) is not None:
                out.append((f"{name} {param.name}", cmd, param))
    return out


def test_every_bool_str_path_and_enum_parameter_gets_a_plain_converter() -> None:
    names = {n for n, _, _ in _params()}
    assert {"doctor from_", "doctor fmt", "doctor only", "doctor fail_on", "doctor verbose"} <= names
    assert {"snapshot output", "triage path", "tune set_", "gputune debug"} <= names
    assert "plan port" not in names and "launch telemetry_interval" not in names  # int/float stay with typer


@pytest.mark.parametrize("label,cmd,param", _params(), ids=lambda x: x if isinstance(x, str) else "")
def test_plain_converter_matches_typers_own_value_for_value_and_error_for_error(
    label: str, cmd: Any, param: Any
) -> None:
    ctx = pytest.importorskip("typer._click").Context(cmd)
    theirs = coercion.build_runtime_param(param.type_descriptor)
    ours = plain_converter(param.type_descriptor)
    assert type(theirs).__name__ != type(ours).__name__
    for value in SAMPLES[_kind(param)]:
        assert _outcome(ours, value, param, ctx) == _outcome(theirs, value, param, ctx), (label, value)


def test_doctor_imports_neither_pydantic_nor_importlib_metadata(tmp_path: Path) -> None:
    r = run_python("-X", "importtime", "-m", "tuner", "doctor", "--format", "json", "--only", "cpu.governor")
    assert r.returncode in (0, 1), r.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")
    }
    assert "tuner.doctor" in imported and "typer" in imported
    assert not {m for m in imported if m.split(".")[0] == "pydantic" or m.startswith("importlib.metadata")}


def test_a_bad_choice_is_still_a_usage_error_naming_the_choices() -> None:
    r = run_python("-m", "tuner", "doctor", "--format", "xml")
    assert r.returncode == 2
    assert "Invalid value for '--format'" in r.stderr and "'xml' is not one of 'table', 'json'" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_usage_error_is_exit_2_where_click_is_not_installed(tmp_path: Path) -> None:
    """typer >= 0.20 vendors click and does not install it: a fresh `pip install -e .` has no click, and
    a bad value must still be a usage error (exit 2 and typer's message), not an ImportError. The child
    makes `import click` fail as it does there (this venv has click through vLLM)."""
    code = (
        "import sys; sys.modules['click'] = None; sys.argv = ['gputune', 'triage', '--exit-code', 'abc', "
        f"{str(tmp_path / 'x.log')!r}]; from tuner.cli import main; main()"
    )
    r = run_python("-c", code)
    assert r.returncode == 2, r.stderr
    assert "Invalid value for '--exit-code'" in r.stderr
    assert "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr
