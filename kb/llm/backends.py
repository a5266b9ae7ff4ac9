"""Language-model backends behind one ``Generator`` interface, picked by name from a registry.

``llamacpp`` runs any GGUF file in-process with llama-cpp-python (grammar-constrained JSON);
``openai`` talks to any OpenAI-compatible server (vLLM, llama.cpp's server, ...) through
langchain-openai. Only this module imports llama_cpp or langchain_openai, and only when a
backend is first used, so the engine and ``--help`` never pay for them.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterator

from kb.core.settings import Settings

Messages = list[dict[str, str]]
"""Chat messages: ``{"role": "system" | "user" | "assistant", "content": str}``."""

TEMPERATURE = 0.0
"""Greedy decoding: the same request gives the same answer, which makes the cache honest."""


class LLMError(RuntimeError):
    """The model did not produce an answer (bad output, timeout, backend error)."""


class LLMUnavailable(LLMError):
    """The model cannot be reached or loaded (server down, GGUF file missing)."""


class LLMTimeout(LLMError):
    """The model took longer than ``llm_timeout`` seconds."""


def merge_turns(messages: Messages) -> Messages:
    """Merge consecutive messages of the same role (many chat templates insist on alternation)."""
    out: Messages = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            out[-1] = {"role": message["role"], "content": out[-1]["content"] + "\n\n" + message["content"]}
        else:
            out.append(dict(message))
    return out


class Generator(ABC):
    """A chat model that answers in constrained JSON or streams free text."""

    backend: str = ""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.context = settings.llm_context
        self.timeout = settings.llm_timeout

    @property
    @abstractmethod
    def model_id(self) -> str:
        """The model's name as recorded in traces (file name or served model name)."""

    def describe(self) -> dict:
        """Backend, model and the settings that shape its answers (recorded in every trace)."""
        return {"backend": self.backend, "model": self.model_id, "temperature": TEMPERATURE,
                "context": self.context, "timeout_s": self.timeout}

    def count_tokens(self, text: str) -> int:
        """Tokens in a text; a conservative estimate unless the backend has the tokenizer."""
        return len(text) // 3 + 1

    @abstractmethod
    def generate_json(self, messages: Messages, schema: dict, max_tokens: int) -> str:
        """Raw answer text, constrained to the JSON schema where the backend can do so."""

    @abstractmethod
    def stream(self, messages: Messages, max_tokens: int) -> Iterator[str]:
        """The answer as it is generated, piece by piece."""


class LlamaCppGenerator(Generator):
    """Any GGUF model run in-process by llama-cpp-python; JSON answers constrained by a grammar."""

    backend = "llamacpp"

    def __init__(self, settings: Settings):
        super().__init__(settings)
        if not settings.llm_model:
            raise LLMUnavailable("PMKB_LLM=llamacpp needs PMKB_LLM_MODEL set to the path of a GGUF file")
        self.path = Path(settings.llm_model).expanduser()
        self._llama = None
        self._lock = threading.Lock()  # a Llama context serves one request at a time
        self.gpu_layers = 0
        # llama-cpp-python's own default is half the cores for generation: pmkb sets both counts.
        cores = os.cpu_count() or 1
        self.threads = settings.llm_threads or max(1, cores - 1)
        self.batch_threads = settings.llm_batch_threads or cores

    @property
    def model_id(self) -> str:
        """The GGUF file name."""
        return self.path.name

    def describe(self) -> dict:
        """Settings including GPU offload (0 layers when llama.cpp was built without a GPU backend) and
        the CPU threads it runs on."""
        return {**super().describe(), "gpu_layers": self.gpu_layers, "threads": self.threads,
                "batch_threads": self.batch_threads}

    @property
    def llama(self):
        """The loaded model (loaded on first use)."""
        if self._llama is None:
            if not self.path.is_file():
                raise LLMUnavailable(f"GGUF file {self.path} not found; set PMKB_LLM_MODEL to a .gguf path")
            import llama_cpp

            self.gpu_layers = self.settings.llm_gpu_layers if llama_cpp.llama_supports_gpu_offload() else 0
            try:
                self._llama = llama_cpp.Llama(model_path=str(self.path), n_ctx=self.context,
                                              n_gpu_layers=self.gpu_layers, n_threads=self.threads,
                                              n_threads_batch=self.batch_threads, seed=0, verbose=False)
            except (ValueError, RuntimeError) as exc:
                raise LLMUnavailable(f"llama.cpp cannot load {self.path}: {exc}") from exc
        return self._llama

    def count_tokens(self, text: str) -> int:
        """Exact token count with the model's tokenizer."""
        return len(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _chunks(self, messages: Messages, max_tokens: int, grammar=None) -> Iterator[str]:
        deadline = time.monotonic() + self.timeout
        with self._lock:
            try:
                pieces = self.llama.create_chat_completion(
                    messages=merge_turns(messages), temperature=TEMPERATURE, max_tokens=max_tokens,
                    grammar=grammar, stream=True, seed=0)
                for chunk in pieces:
                    if time.monotonic() > deadline:
                        pieces.close()  # stops the generation loop inside llama.cpp
                        raise LLMTimeout(f"{self.model_id} did not finish within {self.timeout:g} s "
                                         "(PMKB_LLM_TIMEOUT)")
                    text = chunk["choices"][0]["delta"].get("content")
                    if text:
                        yield text
            except ValueError as exc:  # e.g. prompt longer than the context window
                raise LLMError(f"llama.cpp rejected the request: {exc}") from exc

    def generate_json(self, messages: Messages, schema: dict, max_tokens: int) -> str:
        """Answer constrained by a GBNF grammar built from the JSON schema."""
        from llama_cpp.llama_grammar import LlamaGrammar

        grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
        return "".join(self._chunks(messages, max_tokens, grammar))

    def stream(self, messages: Messages, max_tokens: int) -> Iterator[str]:
        """Free text, token by token."""
        yield from self._chunks(messages, max_tokens)


class OpenAIGenerator(Generator):
    """Any OpenAI-compatible server through langchain-openai's ChatOpenAI.

    JSON answers ask for ``json_schema`` structured output first; servers that refuse it get
    ``json_object`` with the schema attached (llama.cpp's server), then plain JSON mode. The
    answer is validated by the caller in every case.
    """

    backend = "openai"
    MODES = ("json_schema", "json_object_schema", "json_object")

    def __init__(self, settings: Settings):
        super().__init__(settings)
        if not settings.llm_base_url:
            raise LLMUnavailable("PMKB_LLM=openai needs PMKB_LLM_BASE_URL (e.g. http://127.0.0.1:8000/v1)")
        self.base_url = settings.llm_base_url
        self._chat = None
        self.mode: str | None = None  # the structured-output mode the server accepted

    @property
    def model_id(self) -> str:
        """The served model name."""
        return self.settings.llm_model or "default"

    def describe(self) -> dict:
        """Settings including the server's URL."""
        return {**super().describe(), "base_url": self.base_url}

    @property
    def chat(self):
        """The ChatOpenAI client (built on first use; no retries: failures fall back at once)."""
        if self._chat is None:
            from langchain_openai import ChatOpenAI

            key = self.settings.llm_api_key.get_secret_value() if self.settings.llm_api_key else "none"
            self._chat = ChatOpenAI(model=self.model_id, base_url=self.base_url, api_key=key,
                                    temperature=TEMPERATURE, timeout=self.timeout, max_retries=0)
        return self._chat

    def _translate(self, exc: Exception) -> LLMError:
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return LLMTimeout(f"{self.base_url} did not answer within {self.timeout:g} s (PMKB_LLM_TIMEOUT)")
        if isinstance(exc, openai.APIConnectionError):
            return LLMUnavailable(f"cannot reach the model server at {self.base_url}: start it, fix "
                                  "PMKB_LLM_BASE_URL, or set PMKB_LLM=none")
        return LLMError(f"model server {self.base_url} failed: {exc}")

    @staticmethod
    def _limit(max_tokens: int) -> dict:
        # ChatOpenAI sends max_completion_tokens; llama.cpp's server only reads max_tokens.
        return {"max_tokens": max_tokens, "extra_body": {"max_tokens": max_tokens}}

    def _runnable(self, mode: str, schema: dict, max_tokens: int):
        chat = self.chat.bind(**self._limit(max_tokens))
        if mode == "json_schema":
            named = {"name": "answer", "schema": schema, "strict": True}
            return self.chat.with_structured_output(named, method="json_schema", include_raw=True,
                                                    **self._limit(max_tokens))
        if mode == "json_object_schema":
            return chat.bind(response_format={"type": "json_object", "schema": schema})
        return chat.bind(response_format={"type": "json_object"})

    def generate_json(self, messages: Messages, schema: dict, max_tokens: int) -> str:
        """Structured answer text; tries the server's supported modes in order and remembers the first."""
        import openai

        modes = [self.mode] if self.mode else list(self.MODES)
        for number, mode in enumerate(modes):
            try:
                out = self._runnable(mode, schema, max_tokens).invoke(messages)
            except openai.APIStatusError as exc:  # the server refused the mode (400, 422, or 500 from
                if number + 1 < len(modes):       # llama.cpp's server): try the next one
                    continue
                raise self._translate(exc) from exc
            except openai.LengthFinishReasonError as exc:  # cut at max_tokens: let validation reject it
                self.mode = mode
                return exc.completion.choices[0].message.content or ""
            except openai.OpenAIError as exc:
                raise self._translate(exc) from exc
            self.mode = mode
            message = out["raw"] if isinstance(out, dict) else out
            return message.content if isinstance(message.content, str) else json.dumps(message.content)
        raise LLMError(f"model server {self.base_url} accepted no structured-output mode")

    def stream(self, messages: Messages, max_tokens: int) -> Iterator[str]:
        """Free text, chunk by chunk as the server streams it."""
        import openai

        try:
            for chunk in self.chat.bind(**self._limit(max_tokens)).stream(messages):
                if isinstance(chunk.content, str) and chunk.content:
                    yield chunk.content
        except openai.OpenAIError as exc:
            raise self._translate(exc) from exc


GENERATORS: dict[str, Callable[[Settings], Generator] | None] = {
    "none": None,
    "llamacpp": LlamaCppGenerator,
    "openai": OpenAIGenerator,
}
"""Backends by name; ``none`` means the engine works alone."""


def make_generator(settings: Settings, name: str | None = None) -> Generator | None:
    """The generator named by ``settings.llm`` (or ``name``); None for ``none``."""
    name = name or settings.llm
    if name not in GENERATORS:
        raise ValueError(f"LLM backend {name!r} is not supported. Available: {', '.join(GENERATORS)}")
    factory = GENERATORS[name]
    return factory(settings) if factory else None


_SHARED: dict[tuple, Generator | None] = {}
_SHARED_LOCK = threading.Lock()


def shared_generator(settings: Settings) -> Generator | None:
    """One generator per backend configuration and process, so a GGUF is loaded once."""
    key = (settings.llm, settings.llm_model, settings.llm_base_url, settings.llm_gpu_layers,
           settings.llm_context, settings.llm_timeout, settings.llm_threads, settings.llm_batch_threads)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = make_generator(settings)
        return _SHARED[key]


def request_key(*parts) -> str:
    """sha256 over the JSON of everything that determines an answer (template, model, inputs)."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Answers to identical requests: an in-memory LRU in front of JSON files under ``home``."""

    def __init__(self, folder: Path | None, size: int = 256):
        self.folder = folder
        self.size = size
        self._memory: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path | None:
        return self.folder / key[:2] / f"{key}.json" if self.folder else None

    def get(self, key: str) -> tuple[str | None, str | None]:
        """(answer, "memory" | "disk") or (None, None) on a miss."""
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key], "memory"
        path = self._path(key)
        if path and path.is_file():
            try:
                answer = json.loads(path.read_text(encoding="utf-8"))["answer"]
            except (OSError, ValueError, KeyError):
                return None, None  # a torn or foreign file is a miss, rewritten on the next put
            self._remember(key, answer)
            return answer, "disk"
        return None, None

    def _remember(self, key: str, answer: str) -> None:
        with self._lock:
            self._memory[key] = answer
            self._memory.move_to_end(key)
            while len(self._memory) > self.size:
                self._memory.popitem(last=False)

    def put(self, key: str, answer: str, meta: dict | None = None) -> None:
        """Store an answer (write to a temporary file, then rename, so readers never see half a file)."""
        self._remember(key, answer)
        path = self._path(key)
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"answer": answer, **(meta or {})}, ensure_ascii=False), encoding="utf-8")
            tmp.replace(path)
