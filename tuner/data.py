"""Where the shipped data files (checks/, playbooks/) live.

In a wheel they are installed inside the package as ``tuner/_data/``; in a
source checkout (editable install, ``PYTHONPATH=.``) they are the top-level
``checks/`` and ``playbooks/`` folders beside ``tuner/``.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

_PKG = Path(__file__).resolve().parent


@functools.cache
def data_dir(name: str) -> Path:
    """Return the folder of shipped data called ``name`` ("checks" or "playbooks")."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gputune data folder {name!r} is missing from the installation")


def load_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def toml_files(name: str, sub: str = "") -> list[Path]:
    """All ``*.toml`` files under a data folder, sorted for a stable order."""
    base = data_dir(name) / sub if sub else data_dir(name)
    return sorted(base.glob("*.toml")) if base.is_dir() else []
