"""The configuration of a probe run (`offscope probe`'s options), checked before it starts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from offscope.errors import InputError
from offscope.probes.probe_bank import Bank

LEDGER_ID = "offscope-probe"  # the embedded proxy's ledger, which labels its histograms
STOCHASTIC_T = 0.7


@dataclass
class ProbeConfig:
    paths: list[str]
    out: Path
    rules: str = "offscope"
    bank: Bank = "both"
    runs: int = 5
    budget: int | None = 600
    seed: int = 0
    model_url: str | None = None  # None: the simulated model on loopback
    model: str | None = None
    api_key_env: str | None = None
    disposition: str = "probe-default"
    workers: int = 8
    timeout: float = 120.0
    n_boot: int = 1000
    agents_only: bool = False
    confdir: Path | None = None

    @property
    def simulated(self) -> bool:
        return self.model_url is None

    def check(self) -> None:
        if self.runs < 0:
            raise InputError("--runs must be 0 or more")
        if self.budget is not None and self.budget < 1:
            raise InputError("--budget must be at least 1")
        if (self.model_url is None) != (self.model is None):
            raise InputError(
                "--model-url and --model go together",
                hint="name both, or neither for the simulated model",
            )
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise InputError(
                f"environment variable {self.api_key_env} is not set",
                hint="export it, or drop --api-key-env",
            )
        if self.workers < 1:
            raise InputError("--workers must be at least 1")
