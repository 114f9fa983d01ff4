"""Where specdeck keeps things, read from the environment at the moment they are needed."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _xdg(var: str, default: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / default)


class Paths(BaseSettings):
    """Directories and files. Every field can be set by an environment variable `SPECDECK_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="SPECDECK_")

    home: Path = Field(
        default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "specdeck",
        description="specdeck's cache: mirror-assembled models, verification records, staging.",
    )
    config_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_CONFIG_HOME", ".config") / "specdeck",
        description="specdeck's configuration directory.",
    )
    models_file: Path | None = Field(
        default=None,
        description="The model catalogue (models.toml). Default: the one shipped with specdeck.",
    )

    @property
    def store(self) -> Path:
        """Models assembled from mirrors, one folder per SHA-256."""
        return self.home / "models"

    @property
    def staging(self) -> Path:
        return self.home / "staging"

    @property
    def verified_file(self) -> Path:
        return self.home / "verified.json"

    @property
    def headers(self) -> Path:
        """GGUF headers read from the hub before a download, one file per ETag."""
        return self.home / "headers"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"


class HubSettings(BaseSettings):
    """How the Hugging Face hub is reached. Reads the hub's own variables (HF_ENDPOINT, HF_TOKEN ...)."""

    model_config = SettingsConfigDict(env_prefix="HF_")

    endpoint: str = Field(default="https://huggingface.co", description="HF_ENDPOINT")
    token: str | None = Field(default=None, description="HF_TOKEN")
    home: Path = Field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "huggingface")
    hub_cache: Path | None = Field(default=None, description="HF_HUB_CACHE")
    hub_offline: bool = Field(default=False, description="HF_HUB_OFFLINE")
    hub_etag_timeout: float = Field(
        default=5.0, description="seconds to wait for the hub to answer before trying the next source"
    )

    @property
    def cache_dir(self) -> Path:
        return self.hub_cache or self.home / "hub"


def paths() -> Paths:
    return Paths()


def hub_settings() -> HubSettings:
    return HubSettings()
