"""The sidecar's settings: one pydantic model, filled alike from CLI flags and a TOML file.

Layout: the ``[server]`` table maps to un-prefixed flags (``--sglang-url``), every other table to
prefixed ones (``--policy-mode``, ``--admission-headroom``). Flags are generated from the model, so
``--help`` documents every field and a new field is a new flag without further code.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sidecar.policy.settings import AdmissionSettings, PolicySettings


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sglang_url: str = Field("http://127.0.0.1:30000", description="Base URL of the SGLang server.")
    worker_urls: str = Field(
        "",
        description="Several SGLang workers: their base URLs, space- or comma-separated (replaces "
        "--sglang-url). The sidecar places each new session on the one with room for it and keeps "
        "its turns there. With --smg-url and no worker URLs, the workers are smg's (its /workers).",
    )
    smg_url: str | None = Field(
        None,
        description="smg (Shepherd Model Gateway) in front of the workers: /generate goes through it "
        "with X-SMG-Target-Worker (start smg with --policy consistent_hashing or manual); health "
        "checks, retries and worker registration stay smg's.",
    )
    host: str = Field("127.0.0.1", description="Address the sidecar listens on.")
    port: int = Field(8000, ge=0, le=65535, description="Port the sidecar listens on.")
    tokenizer: str | None = Field(
        None,
        description="Model folder with tokenizer and chat template (transformers). "
        "Default: the tokenizer_path SGLang's /server_info reports.",
    )
    model_name: str | None = Field(
        None, description="Model id served on /v1/models. Default: SGLang's served_model_name."
    )
    accept_any_model: bool = Field(
        False,
        description="Accept any `model` in requests. Off: a name other than the served model (/v1/models) is a "
        "404 model_not_found, as OpenAI answers; a request without `model` gets the served one.",
    )
    tool_parser: Literal["hermes", "qwen3", "none"] = Field(
        "hermes", description="How tool calls are parsed from model output (qwen3 = hermes)."
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="Largest request body accepted; larger gets 413."
    )
    body_timeout: float = Field(
        30.0, gt=0, description="Seconds a request body may take to arrive; slower gets 408 and the connection is closed."
    )
    body_min_rate: int = Field(
        16_384,
        ge=0,
        description="Least average rate (bytes/s) a request body must keep from its fifth second on; slower gets 408 "
        "(0 = only --body-timeout).",
    )
    max_json_values: int = Field(
        200_000,
        ge=1000,
        description="Most JSON values (objects, arrays, strings, numbers) one request body may hold; counted before "
        "it is parsed, so a body of countless tiny values is refused without the work.",
    )
    max_messages: int = Field(10_000, ge=1, description="Most messages one request may carry.")
    max_tools: int = Field(1024, ge=1, description="Most tools one request may declare.")
    max_content_parts: int = Field(
        10_000, ge=1, description="Most content parts (text pieces of a message) one request may carry in all."
    )
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Most prompt tokens one request may have. Default: SGLang's max_req_input_len."
    )
    default_max_tokens: int = Field(
        4096, ge=1, description="max_tokens used when the request sets none."
    )
    request_timeout: float = Field(
        600.0, gt=0, description="Seconds one engine request may take before the agent gets 504."
    )
    connect_timeout: float = Field(5.0, gt=0, description="Seconds to connect to SGLang.")
    stream_write_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a streamed reply may wait for a client that stopped reading; then the stream is cut "
        "and its SGLang request aborted.",
    )
    tokenize_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a large prompt may wait for a tokenizer thread (large prompts are tokenized off the "
        "event loop, keys taking turns); past it the request gets 503.",
    )
    allowed_hosts: str = Field(
        "",
        description="Host names requests may be addressed to, space- or comma-separated (`.example.com`: it and "
        "its subdomains; `*`: any). Always allowed: IP addresses, loopback names, the --host address (with "
        "0.0.0.0 or ::, this machine's names). Others get 403, as does a browser's Origin naming another host: "
        "no web page can reach the sidecar by re-pointing its own hostname (DNS rebinding).",
    )
    max_connections: int = Field(
        0, ge=0, description="Most client connections open at once; more are answered 503 and closed (0: three "
        "quarters of the open-files limit, less a reserve).",
    )
    max_connections_per_peer: int = Field(
        0, ge=0, description="Most client connections open from one address (0: three quarters of --max-connections)."
    )
    header_timeout: float = Field(
        10.0, gt=0, description="Seconds a new connection has to send its first request's headers; then it is closed."
    )
    keepalive_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds an idle client connection stays open; 2 s once three quarters of --max-connections are open.",
    )
    tokenize_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Threads that prepare large prompts off the event loop. Each key runs at most all but one of "
        "them at once and keys take turns, so one key's large prompts never hold up another key's.",
    )
    startup_wait: float = Field(
        30.0,
        ge=0,
        description="Seconds the sidecar waits at startup for SGLang's /server_info (model, KV capacity); "
        "after that it starts anyway and /health reports the engine down.",
    )
    connect_retries: int = Field(
        3,
        ge=0,
        description="Retries of an engine request that failed to connect or whose connection SGLang dropped "
        "before answering (nothing received yet, so nothing is duplicated).",
    )
    engine_keepalive: float = Field(
        4.0,
        gt=0,
        description="Seconds an idle connection to SGLang is reused. Keep it below SGLang's own keep-alive "
        "(SGLANG_TIMEOUT_KEEP_ALIVE, 5 s), or a turn sent after a ~5 s tool gap races the server closing the "
        "connection.",
    )
    max_sessions: int = Field(
        10_000, ge=1, description="Most sessions remembered; the least recently used is forgotten."
    )
    max_session_bytes: int = Field(
        2 * 1024**3,
        ge=1024 * 1024,
        description="Most bytes the remembered sessions' token ids may take in all (a long session holds ~2 MB); "
        "past it the least recently used sessions are forgotten first.",
    )
    session_idle_grace: float = Field(
        60.0, ge=0, description="Seconds past its lease an idle session is kept before it is closed."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or as one JSON object a line (fields time, level, logger, message, "
        "session, status, ...)."
    )
    log_slow_requests: float = Field(
        30.0,
        ge=0,
        description="Requests taking at least this many seconds (to the last byte) are logged at info, as every "
        "4xx/5xx is; the rest at debug (0 = only errors). Lines name the session, never message content.",
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        "auto",
        description="Event loop: uvloop (optional package, less CPU per request), asyncio, or auto "
        "(uvloop when it is installed).",
    )
    api_key: str | None = Field(
        None,
        description="Key agents must send as 'Authorization: Bearer KEY'. Unset (and no --api-keys-file): no auth. "
        "Prefer a config file or --api-keys-file: flags show in ps.",
    )
    api_keys_file: str | None = Field(
        None,
        description="File of accepted keys, one a line ('#' comments). Each key has its own sessions. "
        "Re-read when it changes.",
    )
    protect_metrics: bool = Field(False, description="With auth on, /metrics needs a key too.")
    protect_sessions: bool = Field(
        True,
        description="With auth on, GET /v1/sessions needs a key (and lists only that key's sessions); "
        "off: without a key it lists every session. Closing a session always needs its key.",
    )
    key_queue_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="With auth on, the largest share of the admission queue (--admission-max-queue) one key's new "
        "sessions may hold; past it that key gets 429 while other keys' new sessions still queue.",
    )
    key_rate_limit: float = Field(
        0.0, ge=0, description="With auth on, requests per second one key may send; past it 429 + Retry-After (0 = no limit)."
    )
    key_rate_burst: int = Field(20, ge=1, description="Requests one key may send at once above --key-rate-limit.")
    cache_isolation: bool = Field(
        True,
        description="With auth on, each key's requests carry their own SGLang cache namespace (cache_salt), so no "
        "key can learn from cached_tokens or timing what another key's prompts hold. Off: all keys share one "
        "prefix cache.",
    )
    shared_prefix_file: str | None = Field(
        None,
        description="With cache isolation: a file holding a system prompt every key's agents use (an agent "
        "framework's). Requests whose first message is a system message of exactly this text share one cache "
        "namespace across keys; their cached_tokens count the system block only when it was cached whole, plus "
        "the key's own history. Trade-off: README, Auth.",
    )
    sglang_api_key: str | None = Field(
        None, description="SGLang's --api-key, sent as 'Authorization: Bearer' on every engine call."
    )

    @field_validator("worker_urls", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> str:
        """A list (TOML) or a space/comma-separated string; each an http(s) URL."""
        urls = value if isinstance(value, list) else str(value or "").replace(",", " ").split()
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {url!r} is not an http(s) URL")
        return " ".join(u.rstrip("/") for u in urls)

    @field_validator("smg_url")
    @classmethod
    def _smg_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"smg URL {value!r} is not an http(s) URL")
        return value.rstrip("/") if value else value

    def worker_url_list(self) -> list[str]:
        """The workers named on the command line or in the config (empty: --sglang-url, or smg's)."""
        return self.worker_urls.split()



class SidecarSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: ServerSettings = Field(default_factory=ServerSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)


class SettingsError(Exception):
    """A config file or flag value that cannot be used; the message is meant for the user."""


def flag_name(section: str, field: str) -> str:
    name = field.replace("_", "-")
    return name if section == "server" else f"{section}-{name}"


def iter_fields():
    """(section, field name, FieldInfo) for every setting, in declaration order."""
    for section, section_info in SidecarSettings.model_fields.items():
        model = section_info.annotation
        for name, info in model.model_fields.items():
            yield section, name, info


def load_settings(config_file: str | Path | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> SidecarSettings:
    """Settings from an optional TOML file, then flag overrides ({section: {field: value}}) on top."""
    data: dict[str, dict[str, Any]] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SettingsError(f"config file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"cannot read config file {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
        for section, table in raw.items():
            if not isinstance(table, dict):
                raise SettingsError(f"config file {path}: '{section}' must be a table like [{section}]")
            data[section] = dict(table)
    for section, values in (overrides or {}).items():
        data.setdefault(section, {}).update(values)
    try:
        return SidecarSettings.model_validate(data)
    except ValidationError as exc:
        source = f"config file {config_file}" if config_file else "flags"
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"invalid settings ({source}): {problems}") from None


def settings_reference(fmt: str = "toml") -> str:
    """Every setting documented once: a commented TOML template or a markdown table (README)."""
    import json

    def show(value):
        return "(unset)" if value is None else json.dumps(value)

    lines: list[str] = []
    if fmt == "markdown":
        lines += ["| flag | config key | default | meaning |", "|---|---|---|---|"]
        for section, name, info in iter_fields():
            lines.append(f"| `--{flag_name(section, name)}` | `[{section}] {name}` | `{show(info.default)}` | {info.description} |")
        return "\n".join(lines)
    current = None
    for section, name, info in iter_fields():
        if section != current:
            lines += ["", f"[{section}]"]
            current = section
        lines.append(f"# {info.description} (flag --{flag_name(section, name)})")
        prefix = "# " if info.default is None else ""
        value = '""' if info.default is None else show(info.default)
        lines.append(f"{prefix}{name} = {value}")
    return "\n".join(lines).strip() + "\n"
