"""Where the embedded default model lives (shipped inside the package, trained by
gearshift.train; see docs/default_model.md).

Data flow: LLM(model=None) / `gearshift serve` with no --model -> default_target_dir().
"""

from __future__ import annotations

from pathlib import Path

from gearshift.config import ConfigError

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "default_model"


def default_target_dir() -> Path:
    path = DEFAULT_MODEL_DIR / "target"
    if not (path / "config.json").is_file():
        raise ConfigError(f"the embedded default model is missing at {path}; pass --model DIR")
    return path


def is_default_target(model: str) -> bool:
    """Is `model` the embedded default model's directory?"""
    path = Path(model)
    return path.is_dir() and path.resolve() == (DEFAULT_MODEL_DIR / "target").resolve()


def default_head_dir() -> Path:
    path = DEFAULT_MODEL_DIR / "eagle3"
    if not (path / "config.json").is_file():
        raise ConfigError(f"the embedded EAGLE-3 head is missing at {path}; pass --draft-model DIR")
    return path
