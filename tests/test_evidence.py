"""Signatures are data: every one is tested on its own examples; loader errors name the signature."""

from pathlib import Path

import pytest
import yaml

from kb.core.settings import DATA_DIR
from kb.core.taxonomy import TaxonomyError, load_low_util_taxonomy, load_taxonomy
from kb.engine.evidence import find_evidence, find_suspect, load_signatures

TAX = load_taxonomy(DATA_DIR / "taxonomy.yaml")
LOW = load_low_util_taxonomy(DATA_DIR / "low_gpu_utilisation.yaml")
SIGNATURES = load_signatures(DATA_DIR / "signatures.yaml", TAX, LOW)


@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: s.id)
def test_signature_matches_its_examples_only(sig):
    assert sig.examples, f"{sig.id} has no example"
    for line in sig.examples:
        assert sig.compiled().search(line), f"{sig.id} misses its example {line!r}"
    for line in sig.counter_examples:
        assert not sig.compiled().search(line), f"{sig.id} fires on counter-example {line!r}"


def test_required_signals_are_covered():
    cases = {
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.": "gpu_lost",
        "NVRM: Xid (PCI:0000:18:00): 48, pid=7, An uncorrectable double bit error (DBE) has been detected": "gpu_memory_error",
        "NVRM: Xid (PCI:0000:86:00): 74, pid=3, NVLink: fatal error detected on link 2": "gpu_nvlink_error",
        "NVRM: Xid (PCI:0000:c1:00): 119, pid=9, Timeout waiting for RPC from GSP!": "gpu_processor_fault",
        "Reason: OOMKilled, Exit Code: 137": "improper_configuration",
        "ModuleNotFoundError: No module named 'flash_attn'": "environment_dependency",
        "slurmstepd: error: *** JOB 1 ON gpu-3 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***": "policy_violation",
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4242> with error 12, opcode 0, len 0": "infiniband_failure",
    }
    for line, cause in cases.items():
        found = find_evidence(line, SIGNATURES)
        assert found and cause in found[0].causes, (line, [e.signal for e in found])


def test_evidence_keeps_the_span_and_line():
    text = "job started\nRuntimeError: CUDA error: an illegal memory access was encountered\nbye"
    found = find_evidence(text, SIGNATURES)
    assert found
    assert "illegal memory access" in found[0].text
    assert text[found[0].start:found[0].end].lower() in text.lower()


def test_plain_text_has_no_evidence():
    assert find_evidence("Could you please add me to the weekly newsletter?", SIGNATURES) == []


def test_bad_signature_file_names_the_signature(tmp_path):
    raw = yaml.safe_load((DATA_DIR / "signatures.yaml").read_text())
    raw["signatures"][2]["causes"] = {"gremlins": 1.0}
    path = tmp_path / "sig.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(TaxonomyError, match=rf"{raw['signatures'][2]['id']}.*unknown root cause 'gremlins'"):
        load_signatures(path, TAX, LOW)
    raw["signatures"][2]["causes"] = {"gpu_lost": 1.0}
    raw["signatures"][2]["pattern"] = "(unclosed"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(TaxonomyError, match=raw["signatures"][2]["id"]):
        load_signatures(path, TAX, LOW)


SUSPECTS = yaml.safe_load((Path(__file__).parent / "data" / "suspects.yaml").read_text())["cases"]


@pytest.mark.parametrize("case", SUSPECTS, ids=lambda c: c["text"][:40])
def test_suspect_node_and_gpu(case):
    suspect = find_suspect(case["text"]) or {}
    assert (suspect.get("node"), suspect.get("gpu")) == (case["node"], case["gpu"])


def test_evidence_says_what_it_points_to():
    cause = find_evidence("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", SIGNATURES)[0]
    assert cause.points_to == cause.category == "gpu_lost"
    symptom_only = [e for e in find_evidence("training hangs after epoch 3", SIGNATURES) if e.category is None]
    assert symptom_only, "a symptom-only signature should match a plain hang"
    assert symptom_only[0].points_to == "symptom job_hang"


@pytest.mark.parametrize(("pattern", "words"), [
    (r"\bbus error\b[^\n]{0,120}(?:/dev/shm|shared memory)", ("bus error",)),  # the longer need
    (r"\b401 Unauthorized\b|\bpermission denied\b", ("401 unauthorized", "permission denied")),
    (r"(?:GPU )?fallen off the bus", ("fallen off the bus",)),  # an optional part needs nothing
    (r"(?:ECC )+errors?", ("error",)),
    (r"Xid[: ]+79", ("xid",)),
    (r"\bnan\b|loss.*inf", ("nan", "loss")),  # one word from each branch
    (r"nan|\d+", None),  # a branch with no word: nothing can be skipped
    (r"(?:x)?\d+", None),
    (r"naïve bayes", None),  # a non-ASCII letter may fold to an ASCII one
])
def test_required_words_are_what_every_match_contains(pattern, words):
    from kb.engine.prefilter import required_words

    assert required_words(pattern) == words


def _every_match(text: str) -> list[tuple[str, int, int]]:
    """Every signature searched without the word test: what find_evidence must return."""
    found = [(sig.id, m.start(), m.end()) for sig in SIGNATURES if (m := sig.compiled().search(text))]
    return sorted(found)


def test_skipping_signatures_without_their_words_changes_no_finding():
    from kb.core.settings import Settings
    from kb.engine.knowledge import KnowledgeBase

    texts = [i.document() for i in KnowledgeBase(Settings(home=Path("/nonexistent"))).bundled_incidents()]
    texts += [line for sig in SIGNATURES for line in (*sig.examples, *sig.counter_examples)]
    texts += ["NCCL WARN NET/IB : Got completion from peer with error 12\n" * 3 + "Xid 79 on gpu-a17",
              "GPU has fallen off the bus (Xid 79) on gpu-a17: naïve résumé"]  # non-ASCII: searched in full
    differ = [t[:80] for t in texts if sorted((e.signal, e.start, e.end) for e in find_evidence(t, SIGNATURES))
              != _every_match(t)]
    assert differ == [] and len(texts) > 3000
