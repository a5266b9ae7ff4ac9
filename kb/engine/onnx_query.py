"""The query side of a sentence-transformers model on ONNX Runtime, without torch.

A new process that answers one question (``pmkb suggest``, ``search``) spends most of its time
importing torch and transformers to embed a dozen words. The same model exported to ONNX answers
from onnxruntime (which chromadb already installs) and the model's own fast tokenizer, in a
fraction of that. The export is made once per model, beside the model cache, by the process that
has torch loaded anyway (``pmkb build``, or the first query embedded with torch), and is used only
if it passes a check: its vectors on probe texts equal the torch model's to a cosine of
``MIN_COSINE``. The vectors are the model's, so the store's record of its embedding model holds.
The export's directory is private to the user (0700) and is not used when it is not.

Supported: BERT-style encoders with mean pooling and normalised output (the bundled MiniLM, and
mpnet); any other layout keeps the torch path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MIN_COSINE = 0.999
FORMAT = 2  # bump when the export's layout changes: older exports are made again
PROBES = ["GPU fell off the bus (Xid 79) on node gpu-a17 during step 4411",
          "ModuleNotFoundError: No module named 'apex' after I rebuilt my image",
          "NCCL WARN NET/IB : Got completion from peer 10.0.0.7 with error 12, opcode 1, len 0",
          "Pods stay Pending: 0/64 nodes are available: insufficient nvidia.com/gpu. " * 20,
          "ジョブが OOM で落ちました — CUDA out of memory. Tried to allocate 2.00 GiB", "x"]


def export_dir(model_dir: Path, cache: Path) -> Path:
    """Where the ONNX export of the model in ``model_dir`` lives: keyed by its weights file (path,
    size and modification time, so a changed model gets a new export without rehashing it)."""
    weights = next((model_dir / n for n in ("model.safetensors", "pytorch_model.bin") if (model_dir / n).exists()),
                   None)
    digest = hashlib.sha256()
    if weights is not None:
        digest.update(f"{weights.stat().st_size}:{weights.stat().st_mtime_ns}:{weights.resolve()}".encode())
    return Path(cache).expanduser() / "onnx" / f"{model_dir.name}-{digest.hexdigest()[:16]}-v{FORMAT}"


def supported(model_dir: Path) -> bool:
    """Whether the model is a transformer with mean pooling and normalisation (what the encoder does)."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return False
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    return (kinds[:2] == ["Transformer", "Pooling"] and set(kinds[2:]) <= {"Normalize"}
            and pooling.get("pooling_mode_mean_tokens") and (model_dir / "tokenizer.json").exists())


class OnnxQueryEncoder:
    """Mean-pooled, normalised vectors from an ONNX export and the model's fast tokenizer."""

    def __init__(self, path: Path, threads: int = 0):
        import onnxruntime
        from tokenizers import Tokenizer

        manifest = json.loads((path / "manifest.json").read_text())
        self.max_length = int(manifest["max_seq_length"])
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_length)
        self.tokenizer.enable_padding(pad_id=int(manifest["pad_id"]), pad_token=manifest["pad_token"])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or min(4, os.cpu_count() or 1)
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(path / "model.onnx"), options,
                                                    providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.dimension = int(self.session.get_outputs()[0].shape[-1])

    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalised float32 vectors, one per text."""
        batch = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in batch], dtype=np.int64)
        mask = np.array([e.attention_mask for e in batch], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]
        summed = (hidden * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.clip(mask.sum(axis=1, keepdims=True), 1, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


def optimise(source: Path, target: Path) -> None:
    """Save the graph as ONNX Runtime rewrites it (fused attention and layer norms, folded
    constants), so that a new process loading it starts in half the time. Extended, not all,
    optimisations: those are the ones that do not tie the file to this processor."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    onnxruntime.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])


def load(model_dir: Path, cache: Path) -> OnnxQueryEncoder | None:
    """The checked export of the model, or None when there is none (or onnxruntime is missing)."""
    path = export_dir(model_dir, cache)
    if not (path / "manifest.json").exists():
        return None
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:  # made private (0700); anything else was not
        log.warning("the ONNX query encoder at %s is not private to this user (mode %o): not used; remove it "
                    "and run `pmkb build` to make it again", path, info.st_mode & 0o777)
        return None
    try:
        return OnnxQueryEncoder(path)
    except Exception as exc:  # noqa: BLE001 - a damaged export costs only speed: torch answers
        log.warning("the ONNX query encoder at %s cannot be used (%s); queries are embedded with torch", path, exc)
        return None


def export(st_model, model_dir: Path, cache: Path) -> Path | None:
    """Export a loaded SentenceTransformer's encoder to ONNX beside the cache, check it against the
    model on ``PROBES`` and keep it only if every cosine is at least ``MIN_COSINE``; the path, or None."""
    target = export_dir(model_dir, cache)
    if (target / "manifest.json").exists():
        return target
    if not supported(model_dir):
        return None
    try:
        import torch
    except ImportError:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    try:
        transformer = st_model[0].auto_model.eval()

        class Encoder(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state

        sample = torch.ones(1, 8, dtype=torch.long)
        axes = {name: {0: "batch", 1: "tokens"} for name in ("input_ids", "attention_mask", "token_type_ids",
                                                             "last_hidden_state")}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes on operators it rewrites
            torch.onnx.export(Encoder(transformer).cpu(), (sample, sample, torch.zeros_like(sample)),
                              str(work / "exported.onnx"),
                              input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
        optimise(work / "exported.onnx", work / "model.onnx")
        (work / "exported.onnx").unlink()
        shutil.copy(model_dir / "tokenizer.json", work / "tokenizer.json")
        tokenizer = st_model.tokenizer
        manifest = {"format": FORMAT, "model": str(model_dir), "max_seq_length": int(st_model.max_seq_length),
                    "pad_id": int(tokenizer.pad_token_id or 0), "pad_token": str(tokenizer.pad_token or "[PAD]")}
        (work / "manifest.json").write_text(json.dumps(manifest))
        expected = st_model.encode(PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        got = OnnxQueryEncoder(work).encode(PROBES)
        worst = float(np.min(np.sum(expected * got, axis=1)))
        if worst < MIN_COSINE:
            log.warning("the ONNX export of %s differs from the model (cosine %.5f < %s): not used",
                        model_dir, worst, MIN_COSINE)
            return None
        manifest["min_cosine"] = round(worst, 6)
        (work / "manifest.json").write_text(json.dumps(manifest))
        try:
            work.rename(target)
        except OSError:  # another process placed it first: theirs is as good
            pass
        return target
    except Exception as exc:  # noqa: BLE001 - no export only costs speed
        log.warning("could not export %s to ONNX for fast queries: %s", model_dir, exc)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
