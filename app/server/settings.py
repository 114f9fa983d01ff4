"""Typed server settings: defaults, then a config file, then environment (SPECDECK_*), then flags."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.errors import SpecdeckError
from app.plan.planner import DraftMax

SHA256 = re.compile(r"[0-9a-f]{64}")


class ServeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECDECK_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to bind (anything but loopback needs an API key)")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    api_key: str | None = Field(None, description="one key, from SPECDECK_API_KEY; never a flag", repr=False,
                                json_schema_extra={"flag": False})
    api_key_file: Path | None = Field(None, description="the named API keys, one per line (see app/server/keys.py); "
                                                        "read again on SIGHUP")
    cors_origins: list[str] = Field(default_factory=list, description="allow this origin by CORS (off when none is given)",
                                    json_schema_extra={"flag": "--cors-origin"})
    max_queue: int = Field(16, ge=0, description="queued requests beyond the busy slots before 429")
    request_timeout: float = Field(600.0, gt=0, description="wall-clock limit per request, seconds")
    tbt_budget: float = Field(1.5, ge=0, description="while a prompt is read beside answers being generated, the answers' "
                              "time between tokens may grow to this multiple of their time alone: decode goes first and "
                              "the prompt gets the time left (the prompt advances at (B - 1) / B of the engine's time "
                              "meanwhile); 0: prompts first (a slice of about 0.5 s of prompt between steps)")
    mixed_batch: Literal["auto", "on", "off"] = Field(
        "auto", description="beside answers, a prompt's next tokens go in the answers' verify decode (one mixed batch) "
        "where that measured cheaper than a step and a chunk apart (a card; a model whose decode is memory-bound): "
        "auto; always: on; never (decode first, the prompt between steps): off")
    max_tokens: int = Field(4096, ge=1, description="cap on max_tokens per request")
    temperature: float | None = Field(None, ge=0.0, le=2.0, json_schema_extra={"flag": "--temp"},
                                      description="sampling temperature of a request that sets none (llama-server's "
                                                  "--temp; default: each API's own, 1.0 for OpenAI's and Anthropic's)")
    keep_alive: float = Field(10.0, gt=0, le=300, description="seconds a stream may stay silent (a long prompt being "
                              "read) before it sends a keep-alive (an SSE comment; Anthropic's ping)")
    shutdown_grace: float = Field(2.0, ge=0, description="seconds generation in flight may go on after SIGTERM")
    start_timeout: float = Field(900.0, gt=0, description="seconds a start may take to load and pass its smoke request "
                                                          "before it counts as failed (with --fallback the last good revision then starts)")
    max_body_bytes: int = Field(32 * 2**20, ge=1024, description="largest request body accepted (413 beyond)")
    max_image_bytes: int = Field(16 * 2**20, ge=1024, description="largest image accepted in a request, bytes "
                                 "(encoded; a larger one is a 413 naming its part)")
    max_image_pixels: int = Field(50_000_000, ge=1, description="largest image accepted, width x height pixels")
    allow_image_urls: bool = Field(False, description="fetch images named by http(s) URL (with the image size limit "
                                   "and a 10 s time limit); off: only data: URIs and base64")
    pins: dict[str, str] = Field(default_factory=dict, json_schema_extra={"flag": False},
                                 description="SHA-256 pins of the model files, by file name (the config's [pins] "
                                             "table): a file that differs refuses the start, naming it")
    draft_max: DraftMax = None  # the plan's input (app/plan/planner.py: one definition)
    threads: int | None = Field(None, ge=1, le=1024, description="CPU threads (default: the physical cores)")
    ui: bool = Field(True, description="serve the chat page to browsers at / and /ui (its conversations kept on the server)",
                     json_schema_extra={"flag": "--no-ui", "negate": True, "help": "no chat page: / answers programs only"})
    speculative: bool = Field(True, description="speculation on by default (requests can turn it off)",
                              json_schema_extra={"flag": "--no-speculative", "negate": True, "help": "start with speculation off"})
    log_prompts: bool = Field(False, description="log request text (off: only counts and timings)")
    strict_model: bool = Field(False, description="answer 404 to requests naming another model (default: serve them with this one)")
    model_aliases: list[str] = Field(default_factory=list, description="another name the served model answers to",
                                     json_schema_extra={"flag": "--alias"})
    models_max: int | None = Field(None, ge=1, le=64, description="models loaded at once at most, of those named with "
                                   "--model (default: as many as the memory plan holds together)")
    default_model: str | None = Field(None, description="the model that answers a request naming a model not served "
                                      "(default: with one model, that one; with several, such a request gets 404)")
    unload_after: float | None = Field(None, description="unload a model idle this long, e.g. 10m (Ollama's "
                                       "OLLAMA_KEEP_ALIVE; default: never; a model's own section may say otherwise)",
                                       json_schema_extra={"duration": True})
    suffix_tokens: int = Field(100_000, ge=0, le=10_000_000,
                               description="recent requests' tokens the suffix drafter indexes (about 125 bytes each; 0: off)")
    cache_ram: int = Field(8192, ge=0, le=2**20, description="MiB of host memory for the prompt caches of slots "
                           "taken by other requests (0: off; at most half the memory the plan leaves free)")
    chat_template_file: Path | None = Field(None, description="use this Jinja chat template in place of the model's own "
                                            "(llama-server's flag of the same name)")
    reasoning_format: Literal["auto", "deepseek", "none"] = Field(
        "auto", description="reasoning apart from the answer (auto, deepseek: reasoning_content, thinking blocks; "
                            "none: the raw text, markers and all, as content)")
    reasoning_budget: Literal[-1, 0] = Field(
        -1, description="thinking by default where the template has a switch: -1 on (as the template decides), 0 off; "
                        "a request still turns it on or off (llama-server's flag; only -1 and 0, as there)")
    slots_endpoint: bool = Field(False, description="serve llama-server's GET /slots (per-slot state)",
                                 json_schema_extra={"flag": "--slots"})

    tls_cert: Path | None = Field(None, description="serve HTTPS with this certificate (PEM; with --tls-key)")
    tls_key: Path | None = Field(None, description="the certificate's private key (PEM)")
    allow_from: list[str] = Field(default_factory=list, description="accept requests only from these networks, "
                                  "CIDR[,CIDR...] (others get 403 before anything else)")
    trusted_proxies: list[str] = Field(default_factory=list, description="proxies whose X-Forwarded-For names the client, "
                                       "CIDR[,CIDR...] (from any other peer the header is ignored)")
    access_log: Path | None = Field(None, description="write the access log (a JSON line per request) to this file "
                                    "(default: the service log)")
    access_log_max_mb: float = Field(100.0, gt=0, description="rotate the access log file at this size, MiB")
    access_log_files: int = Field(5, ge=1, le=1000, description="rotated access log files kept")

    @field_validator("unload_after", mode="before")
    @classmethod
    def _duration(cls, v):
        from app.units import parse_duration

        if v is None or isinstance(v, (int, float)):
            return v
        try:
            return parse_duration(v)
        except SpecdeckError as e:
            raise ValueError(e.message) from None

    @field_validator("tbt_budget")
    @classmethod
    def _budget_is_off_or_past_one(cls, v: float) -> float:
        if 0 < v <= 1:
            raise ValueError("tbt_budget is a multiple of the answers' time alone: above 1 (1.5: half as much more), "
                             "or 0 for prompts first")
        return v

    @field_validator("pins")
    @classmethod
    def _pins_are_sha256(cls, v: dict[str, str]) -> dict[str, str]:
        bad = next((k for k, d in v.items() if not SHA256.fullmatch(str(d).lower())), None)
        if bad is not None:
            raise ValueError(f"the pin of {bad} is not a SHA-256 (64 hex digits)")
        return {k: d.lower() for k, d in v.items()}

    def check(self) -> None:
        if not is_loopback(self.host) and not self.keyring():
            raise SpecdeckError(f"refusing to listen on {self.host} without an API key",
                                hint="set SPECDECK_API_KEY or --api-key-file, or bind 127.0.0.1")
        self.networks("allow_from")
        self.networks("trusted_proxies")
        self.tls_context()
        self.check_access_log()

    def keyring(self):
        """The API keys: the key file's (named), plus SPECDECK_API_KEY's (named `env`)."""
        from app.server.keys import read_keys

        return read_keys(self.api_key_file, self.api_key)

    def check_access_log(self) -> None:
        path = self.access_log
        if path is None:
            return
        if path.is_dir():
            raise SpecdeckError(f"--access-log {path} is a directory", hint="name a file in it")
        if not path.parent.is_dir():
            raise SpecdeckError(f"--access-log {path}: no directory {path.parent}")
        try:
            with path.open("a", encoding="utf-8"):
                pass
        except OSError as e:
            raise SpecdeckError(f"--access-log {path}: cannot write: {e.strerror}") from None

    def networks(self, name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """--allow-from / --trusted-proxies as networks (each value may hold several, comma-separated)."""
        out = []
        for item in (x.strip() for v in getattr(self, name) for x in v.split(",")):
            if not item:
                continue
            try:
                out.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise SpecdeckError(f"bad --{name.replace('_', '-')} {item!r}: not an address or CIDR network",
                                    hint="e.g. 10.0.0.0/8,192.168.1.0/24 or 127.0.0.1") from None
        return out

    def tls_context(self):
        """An SSL context from --tls-cert / --tls-key (None without them), proved loadable now."""
        import ssl

        if self.tls_cert is None and self.tls_key is None:
            return None
        if self.tls_cert is None or self.tls_key is None:
            raise SpecdeckError("--tls-cert and --tls-key go together", hint="give both PEM files, or neither")
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if not path.is_file():
                raise SpecdeckError(f"{flag} {path}: no such file")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (ssl.SSLError, OSError) as e:
            raise SpecdeckError(f"cannot use {self.tls_cert} with {self.tls_key}: {getattr(e, 'reason', None) or e}",
                                hint="both must be PEM, and the key must match the certificate") from None
        return ctx

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings(config: Path | None, overrides: dict, model: type[BaseSettings] = ServeSettings,
                  table: str = "serve"):
    """Config file (TOML: the `table` table; for [serve] the top level too), then the environment,
    then explicit flags."""
    values: dict = {}
    if config is not None and config.exists():
        try:
            raw = tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SpecdeckError(f"{config}: cannot read config: {e}") from None
        values = raw.get(table, raw if table == "serve" else {})
        if table == "serve" and isinstance(raw.get("pins"), dict):  # [pins] is its own table, beside [serve] too
            values = {**values, "pins": raw["pins"]}
    try:
        env = model()
        merged = {**values, **{k: v for k, v in env.model_dump().items() if k in env.model_fields_set}}
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return model(**merged)
    except ValidationError as e:
        first = e.errors()[0]
        where = f"{table}." if table != "serve" else ""
        raise SpecdeckError(f"bad setting {where}{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
