"""Evidence search: every signature's regex over the ticket, against skipping the signatures whose
required words the ticket lacks (kb/engine/prefilter.py), on the same inputs in one process.

    python bench/evidence_search.py

Inputs: the bundled reports one by one (ordinary tickets), a 64 KiB ticket (the largest body the
service accepts) made of real report text, and a 1.6 MB training log with one Xid line at its end.
Both ways must find the same evidence; the script stops if they do not.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kb.core.settings import Settings  # noqa: E402
from kb.core.taxonomy import load_low_util_taxonomy, load_taxonomy  # noqa: E402
from kb.engine.evidence import find_evidence, load_signatures  # noqa: E402
from kb.engine.knowledge import KnowledgeBase  # noqa: E402


def every_signature(text: str, signatures) -> list[tuple[str, int]]:
    """The baseline: each signature's regex searched over the whole text."""
    return sorted((s.id, m.start()) for s in signatures if (m := s.compiled().search(text)))


def timed(fn, texts: list[str]) -> tuple[float, list]:
    start = time.perf_counter()
    out = [fn(t) for t in texts]
    return time.perf_counter() - start, out


def main() -> None:
    settings = Settings(home=Path("/nonexistent"))
    signatures = load_signatures(settings.signatures, load_taxonomy(settings.taxonomy),
                                 load_low_util_taxonomy(settings.low_gpu_taxonomy))
    reports = [i.document() for i in KnowledgeBase(settings).bundled_incidents()]
    big = "\n".join(reports)[:64 * 1024]
    log = "job crashed\nsee log\n" + "step ok\n" * 200_000 + "NVRM: Xid (PCI:0000:3b:00): 48, DBE detected"
    cases = [(f"{len(reports)} bundled reports, one by one", reports), ("one 64 KiB ticket", [big]),
             ("one 1.6 MB log, Xid line last", [log])]
    print(f"{len(signatures)} signatures\n")
    print("| input | every signature (s) | with the word test (s) | speed-up |")
    print("|---|---|---|---|")
    for name, texts in cases:
        base_s, base = timed(lambda t: every_signature(t, signatures), texts)
        fast_s, fast = timed(lambda t: sorted((e.signal, e.start) for e in find_evidence(t, signatures)), texts)
        if base != fast:
            sys.exit(f"{name}: the word test changed the evidence found")
        print(f"| {name} | {base_s:.2f} | {fast_s:.2f} | {base_s / fast_s:.1f}x |")


if __name__ == "__main__":
    main()
