"""Environment switches: the one place Gearshift reads and documents them.

Data flow: a module that honours a switch asks its `EnvSwitch` for the value (`.get()`)
when the table below says; a value outside a switch's choices raises ValueError naming
the variable. Everything else is configured
through EngineConfig and the command line, not the environment.

    variable                values          default  read by
    GEARSHIFT_API_KEY       any string      (none)   server/cli.py, bench/serve.py (per run)
    GEARSHIFT_PDL           auto, on, off   auto     kernels/pdl.py (at import)
    GEARSHIFT_SAMPLER       auto, torch     auto     runner/sampler.py (at import)
    GEARSHIFT_SKINNY_GEMM   auto, off, on   auto     kernels/skinny_select.py (SkinnyChooser())
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvSwitch:
    name: str  # the environment variable
    default: str  # the value when unset or empty
    doc: str  # one line: what the switch does
    choices: tuple[str, ...] = ()  # allowed values (compared lower-case); empty: any string

    def get(self, override: str | None = None) -> str:
        """The switch's value: `override` when given (a caller's own choice, checked the
        same way), else the environment's, else the default. Values with choices come back
        lower-case."""
        raw = override or os.environ.get(self.name, "")
        value = raw or self.default
        if not self.choices:
            return value
        value = value.strip().lower()
        if value not in self.choices:
            raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}, not {raw!r}")
        return value


API_KEY = EnvSwitch(
    "GEARSHIFT_API_KEY", "",
    "the key `serve` requires as 'Authorization: Bearer KEY' on /v1 and `bench serve` "
    "sends (--api-key overrides it)")
PDL = EnvSwitch(
    "GEARSHIFT_PDL", "auto",
    "programmatic dependent launch of the step's Triton kernels on CUDA GPUs of compute "
    "capability >= 9 (auto and on); off never", ("auto", "on", "off"))
SAMPLER = EnvSwitch(
    "GEARSHIFT_SAMPLER", "auto",
    "torch: sample with the plain-torch sampler on CUDA too, not the fused sampling kernel",
    ("auto", "torch"))
SKINNY_GEMM = EnvSwitch(
    "GEARSHIFT_SKINNY_GEMM", "auto",
    "GEMMs of few rows: auto = the skinny Triton kernel where it measured faster than "
    "cuBLAS at start-up, off = always cuBLAS, on = always the kernel (tests)",
    ("auto", "off", "on"))

SWITCHES = (API_KEY, PDL, SAMPLER, SKINNY_GEMM)


def triton_interpret() -> bool:
    """Triton's own TRITON_INTERPRET=1 (kernels run in its CPU interpreter; tests set it):
    kernels pick interpreter-sized blocks then."""
    return os.environ.get("TRITON_INTERPRET") == "1"
