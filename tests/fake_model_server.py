"""A stand-in for an OpenAI-compatible model server (vLLM, llama.cpp's server) on 127.0.0.1.

It answers ``/v1/chat/completions`` with JSON that fits the schema of the request (its
``response_format``): the first root-cause and symptom candidate, the first context incident as
citation, and the explanation the test chose. Every request is recorded. For the real model
behind the same API, see the ``llm`` tests that start ``llama_cpp.server``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Answer = Callable[[dict, list[dict]], dict]
"""(schema, messages) -> the answer object the server returns as the message content."""


def schema_of(body: dict) -> dict:
    """The JSON schema a chat request asks the answer to follow ({} without one)."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return fmt["json_schema"]["schema"]
    return fmt.get("schema") or {}


def first_choices(explanation: str) -> Answer:
    """Answers with the first candidate of each enum and the given explanation."""
    def answer(schema: dict, messages: list[dict]) -> dict:
        props = schema.get("properties", {})
        context = props.get("citations", {}).get("items", {}).get("enum", [])
        return {"root_cause": props["root_cause"]["enum"][0], "symptom": props["symptom"]["enum"][0],
                "citations": context[:1], "explanation": explanation}
    return answer


class FakeModelServer:
    """An OpenAI-compatible chat-completions endpoint in a thread; use as a context manager."""

    def __init__(self, answer: Answer, model: str = "served"):
        self.answer, self.model = answer, model
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests.append(body)
                content = json.dumps(server.answer(schema_of(body), body.get("messages", [])))
                reply = json.dumps({
                    "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion", "created": 0,
                    "model": server.model, "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                                        "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeModelServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def settings(self) -> dict:
        """The PMKB settings that point pmkb at this server."""
        return {"llm": "openai", "llm_base_url": self.base_url, "llm_model": self.model, "llm_timeout": 10.0}
