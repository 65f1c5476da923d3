"""Probes read facts; they never judge.

:class:`Facts` is the lazy bundle the checks read from: each attribute runs its
probe once, on first use, so `gputune doctor --only cpu.governor` pays for the
CPU probe alone. Every probe module exposes ``probe(host) -> <frozen record>``
and never raises for what the host lacks (absent is not an error).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from tuner.host import Host


class Facts:
    """Facts about one host root, each probe run at most once."""

    PROBES = ("gpu", "pcie", "numa", "cpu", "swap", "software", "memory", "kernel", "net")

    def __init__(self, host: Host, **options: Any) -> None:
        self.host = host
        self.options = options  # e.g. under_load=True for the PCIe probe

    @functools.cache  # noqa: B019 - one Facts per doctor run; the cache dies with it
    def get(self, name: str) -> Any:
        if name not in self.PROBES:
            raise KeyError(f"unknown probe {name!r}")
        module = importlib.import_module(f"tuner.probes.{name}")
        return module.probe(self)
