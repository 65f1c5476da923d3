"""Command-line parsing without pydantic, for typer releases that route every parameter through it.

Recent typer releases (0.29 does, 0.27 did not) convert each parameter's value with a pydantic
``TypeAdapter`` built on first use. Importing pydantic for that (with importlib.metadata, which its
plugin loader imports) costs more than all of ``gputune doctor``'s probes.
:func:`coerce_without_pydantic` gives the parameter types gputune's commands use a plain converter.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePath
from typing import Any

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


@functools.cache
def _plain_class() -> Any:
    """The plain converter class, or None when this typer has no pluggable converters."""
    try:
        from typer._click.exceptions import BadParameter
        from typer._click.utils import _escape_control_characters
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_choice, coerce_cli_path
    except ImportError:
        return None

    @dataclass(frozen=True)
    class Plain(RuntimeParam):
        leaf: Any  # bool, str, a PurePath subclass, or an Enum subclass

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if getattr(self.annotation, "__origin__", None) is list:  # typer's parse_list
                items = value if isinstance(value, list | tuple) else [value]
                return [self._leaf(v, param, ctx) for v in items]
            return self._leaf(value, param, ctx)

        def _leaf(self, value: Any, param: Any, ctx: Any) -> Any:
            if self.leaf is bool:
                if isinstance(value, bool):
                    return value
                if isinstance(value, str) and not value.strip():
                    return False  # typer reads an empty value as False
                if isinstance(value, int | float) and value in (0, 1):
                    return bool(value)
                if isinstance(value, str | bytes):
                    text = value if isinstance(value, str) else value.decode(errors="replace")
                    word = (text.strip() if isinstance(value, str) else text).lower()
                    if word in _TRUE or word in _FALSE:
                        return word in _TRUE
                msg = "Input should be a valid boolean"  # pydantic's words: parseable type, or not
                if isinstance(value, str | bytes | int):
                    msg += ", unable to interpret input"
                raise BadParameter(msg, ctx=ctx, param=param)
            try:
                if self.leaf is str:
                    return value if isinstance(value, str) else str(value)
                if issubclass(self.leaf, Enum):
                    choices = list(self.leaf)
                    sensitive = self.parameter_info.case_sensitive
                    return coerce_cli_choice(value, choices=choices, case_sensitive=sensitive, ctx=ctx)
                if not isinstance(value, self.leaf):
                    value = self.leaf(value)
                return coerce_cli_path(value, self.parameter_info, path_type=self.leaf, param=param, ctx=ctx)
            except ValueError as exc:  # worded as typer words a failed pydantic validation
                msg = _escape_control_characters(f"Value error, {exc}")
                raise BadParameter(msg, ctx=ctx, param=param) from exc

    return Plain


def plain_converter(desc: Any) -> Any:
    """A plain converter for a parameter's ``type_descriptor``; None for the types left to typer."""
    plain = _plain_class()
    info, annotation = desc.parameter_info, desc.annotation
    if plain is None or desc.file_annotation is not None or getattr(info, "parser", None) is not None:
        return None
    if getattr(info, "click_type", None) is not None:
        return None
    if getattr(annotation, "__origin__", None) is list and len(getattr(annotation, "__args__", ())) == 1:
        annotation = annotation.__args__[0]
    if not isinstance(annotation, type):
        return None
    if issubclass(annotation, PurePath) and getattr(info, "path_type", None) not in (None, annotation):
        return None
    if annotation in (bool, str) or issubclass(annotation, Enum | PurePath):
        return plain(parameter_info=info, annotation=desc.annotation, leaf=annotation)
    return None


def coerce_without_pydantic() -> None:
    """Give bool, str, Path and Enum parameters (and lists of them) the plain converter.

    The converter calls typer's own choice and path functions and accepts what pydantic's lax
    mode accepts, so values and error messages are the same (tests/test_typer_compat.py compares
    them). Other types (int, float) keep typer's converter. With a typer that has no such hook
    (one that does not use pydantic) this does nothing."""
    try:
        from typer.core import _TyperParameter
    except ImportError:
        return
    if _plain_class() is None or not hasattr(_TyperParameter, "get_runtime_param"):
        return
    if getattr(_TyperParameter, "_gputune_plain", False):
        return
    built = _TyperParameter.get_runtime_param

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            self._runtime_param = plain_converter(self.type_descriptor)
        return built(self)

    setattr(_TyperParameter, "get_runtime_param", get_runtime_param)  # noqa: B010
    setattr(_TyperParameter, "_gputune_plain", True)  # noqa: B010
