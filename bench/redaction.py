"""Redaction: worst-case time per rule family, and recall and false positives on the corpus.

    python bench/redaction.py [--size BYTES] [--skip-before]

Compares the current ``kb/core/redact.py`` with the module as it was at commit 559435e (loaded from
git into a temporary module), on the same inputs:

1. Time: each worst-case input of ``tests/data/redaction_worst.jsonl`` at ``--size`` characters
   (64 KiB, the largest ticket body the service accepts), the slowest per rule family, and an
   ordinary GPU-incident ticket of the same size. The old module is quadratic on some families:
   at 64 KiB its column takes a few minutes.
2. Quality: ``tests/data/redaction_corpus.jsonl``: recall per secret class (every secret gone and
   the right placeholder in its place) and ordinary incident lines changed (false positives).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data"
BASELINE = "559435e"

Redact = Callable[[str], str]


def load_baseline(commit: str = BASELINE) -> Redact:
    """``redact`` of ``kb/core/redact.py`` as it was at ``commit``."""
    source = subprocess.run(["git", "show", f"{commit}:kb/core/redact.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "redact_baseline.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location("redact_baseline", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.redact


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def worst_input(case: dict, size: int) -> str:
    """A worst-case input of exactly ``size`` characters: head, the unit repeated, tail."""
    room = size - len(case["head"]) - len(case["tail"])
    return case["head"] + (case["unit"] * (room // len(case["unit"]) + 1))[:room] + case["tail"]


def ordinary_ticket(corpus: list[dict], size: int) -> str:
    """Ordinary incident lines of the corpus, repeated to ``size`` characters."""
    text = "\n".join(r["text"] for r in corpus if r["class"] == "ordinary")
    return (text * (size // len(text) + 1))[:size]


def seconds(redact: Redact, text: str, repeat: int = 1) -> float:
    """Best wall time of ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        redact(text)
        best = min(best, time.perf_counter() - start)
    return best


def worst_per_family(redact: Redact, cases: list[dict], size: int) -> dict[str, tuple[str, float]]:
    """Family -> (name of its slowest input, seconds)."""
    worst: dict[str, tuple[str, float]] = {}
    for case in cases:
        took = seconds(redact, worst_input(case, size))
        if took > worst.get(case["family"], ("", -1.0))[1]:
            worst[case["family"]] = (case["name"], took)
    return worst


def quality(redact: Redact, corpus: list[dict]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Per secret class (found, total), and the ordinary lines the redaction changed."""
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    changed = []
    for record in corpus:
        out = redact(record["text"])
        if record["class"] == "ordinary":
            if out != record["text"]:
                changed.append(record["text"])
            continue
        leaked = any(s in out or any(len(p) >= 8 and p in out for p in s.split()) for s in record["secrets"])
        found[record["class"]][1] += 1
        found[record["class"]][0] += not leaked and f"[REDACTED:{record['label']}]" in out
    return {k: (v[0], v[1]) for k, v in found.items()}, changed


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f} ms"


def main() -> None:
    """Measure both modules and print the tables."""
    from kb.core.redact import redact

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64 * 1024, help="characters per timed input")
    parser.add_argument("--skip-before", action="store_true", help="do not time the old module (minutes)")
    args = parser.parse_args()
    before = load_baseline()
    corpus, cases = read_jsonl(DATA / "redaction_corpus.jsonl"), read_jsonl(DATA / "redaction_worst.jsonl")

    ordinary = ordinary_ticket(corpus, args.size)
    after_times = worst_per_family(redact, cases, args.size)
    before_times = {} if args.skip_before else worst_per_family(before, cases, args.size)
    ordinary_after = seconds(redact, ordinary, 5)
    ordinary_before = None if args.skip_before else seconds(before, ordinary, 5)
    print(f"\nWorst-case redaction time, {args.size:,} characters, old = {BASELINE}\n")
    print("| family | before | after | before/after | after/ordinary | slowest input (after) |")
    print("|---|---:|---:|---:|---:|---|")
    for family, (name, after) in after_times.items():
        old = before_times.get(family, ("", None))[1]
        ratio = "-" if old is None else f"{old / after:,.0f}x" if old >= 10 * after else f"{old / after:.1f}x"
        print(f"| {family} | {_ms(old)} | {_ms(after)} | {ratio} | {after / ordinary_after:.1f}x | {name} |")
    print(f"| ordinary ticket | {_ms(ordinary_before)} | {_ms(ordinary_after)} | | 1.0x | |")

    print(f"\nCorpus: {sum(r['class'] != 'ordinary' for r in corpus)} secret records in "
          f"{len({r['class'] for r in corpus if r['class'] != 'ordinary'})} classes, "
          f"{sum(r['class'] == 'ordinary' for r in corpus)} ordinary incident lines\n")
    (found_before, changed_before), (found_after, changed_after) = quality(before, corpus), quality(redact, corpus)
    total = sum(v[1] for v in found_after.values())
    redacted = [sum(v[0] for v in f.values()) for f in (found_before, found_after)]
    complete = [sum(v[0] == v[1] for v in f.values()) for f in (found_before, found_after)]
    print("| | before | after |\n|---|---:|---:|")
    print(f"| secret records redacted | {redacted[0]}/{total} ({redacted[0] / total:.0%}) "
          f"| {redacted[1]}/{total} ({redacted[1] / total:.0%}) |")
    print(f"| classes at 100% recall | {complete[0]}/{len(found_after)} | {complete[1]}/{len(found_after)} |")
    print(f"| ordinary lines changed (false positives) | {len(changed_before)} | {len(changed_after)} |")
    print("\nRecall per class below 100% (before -> after):")
    for name in sorted(found_after):
        (old, count), (new, _) = found_before[name], found_after[name]
        if old < count or new < count:
            print(f"  {name:28} {old}/{count} -> {new}/{count}")
    for when, lines in (("before", changed_before), ("after", changed_after)):
        if lines:
            print(f"\nOrdinary lines changed {when}:")
            print("\n".join(f"  {line[:110]}" for line in lines))


if __name__ == "__main__":
    main()
