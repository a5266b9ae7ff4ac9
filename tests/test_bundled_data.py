"""The bundled incident reports: valid labels, unique ids, every category covered, and nothing
taken from the labelled evaluation file (or the evaluation figures would measure recall of it)."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from kb.core.settings import Settings
from kb.core.taxonomy import load_taxonomy
from kb.engine.history import BUNDLED_SOURCE, is_bundled
from kb.engine.knowledge import KnowledgeBase
from tests.conftest import shared_file

SHINGLE = 10  # words; a shared run this long is copied prose (error messages are shorter)
MAX_SHARED_SHINGLES = 1


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    settings = Settings(home=tmp_path_factory.mktemp("kb"))
    return KnowledgeBase(settings).bundled_incidents(), load_taxonomy(settings.taxonomy)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


QUOTED = re.compile(r"`[^`\n]*`|'[^'\n]{8,}?'|\"[^\"\n]{8,}?\"")


def shingles(text: str, n: int = SHINGLE) -> set[tuple[str, ...]]:
    """Word runs of the prose: quoted log lines and error messages are left out, since the same
    error text legitimately appears in many unrelated tickets."""
    tokens = words(QUOTED.sub(" | ", text))
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def test_ids_are_unique_and_labels_are_taxonomy_ids(bundled):
    incidents, taxonomy = bundled
    ids = Counter(i.id for i in incidents)
    assert [i for i, n in ids.items() if n > 1] == []
    for incident in incidents:
        assert incident.root_cause in taxonomy.cause_ids, incident.id
        assert incident.symptom in taxonomy.symptom_ids, incident.id
        assert incident.mitigation in taxonomy.mitigation_ids, incident.id
        assert incident.title and incident.description and incident.resolution, incident.id


def test_every_cause_and_symptom_has_enough_examples(bundled):
    incidents, taxonomy = bundled
    causes = Counter(i.root_cause for i in incidents)
    symptoms = Counter(i.symptom for i in incidents)
    assert min(causes[c] for c in taxonomy.cause_ids) >= 15, causes
    assert min(symptoms[s] for s in taxonomy.symptom_ids) >= 15, symptoms


def test_shingle_check_catches_a_copied_ticket():
    original = "Multi-node job fails at init with a very particular error message about the fabric"
    assert len(shingles(original) & shingles("Title\n" + original + " and more")) > MAX_SHARED_SHINGLES
    assert not shingles(original) & shingles("the job fails at init with an error about the fabric")
    error = "'NCCL WARN NET/IB : Got completion from peer 10.0.0.2 with error 12, opcode 0, vendor err 129'"
    assert not shingles(f"Job 1 on node a fails: {error}") & shingles(f"Since Monday every run logs {error}")


def test_no_bundled_report_copies_an_evaluation_ticket(bundled):
    dev_file = shared_file("data/dev_incidents.jsonl")
    incidents, _ = bundled
    dev = [json.loads(line) for line in dev_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    dev_titles = {" ".join(words(d["title"])) for d in dev}
    dev_shingles = [(d["id"], shingles(f"{d['title']} {d['description']} {d.get('resolution', '')}")) for d in dev]
    copied = []
    for incident in incidents:
        own = shingles(f"{incident.title} {incident.description} {incident.resolution}")
        if " ".join(words(incident.title)) in dev_titles:
            copied.append((incident.id, "same title"))
        copied += [(incident.id, dev_id) for dev_id, theirs in dev_shingles
                   if len(own & theirs) > MAX_SHARED_SHINGLES]
    assert copied == []


def test_reports_of_public_incidents_cite_their_thread_once_and_none_is_an_evaluation_ticket(bundled):
    incidents, _ = bundled
    public = [i for i in incidents if i.source != BUNDLED_SOURCE]
    assert public, "the bundled reports include reports of public incidents"
    assert all(i.source.startswith("https://") for i in public), "a public report cites its thread's address"
    threads = Counter(thread_key(i.source) for i in public)
    assert [t for t, n in threads.items() if n > 1] == []
    assert all(is_bundled(i) for i in public)  # kept out of node history
    dev_file = shared_file("data/dev_incidents.jsonl")  # skips on a clone without ../shared
    held_out = {thread_key(json.loads(line)["source"]) for line in dev_file.read_text(encoding="utf-8").splitlines()
                if line.strip()}
    assert [i.id for i in public if thread_key(i.source) in held_out] == []


HELD_OUT_HEADER = "# Held-out threads"


def thread_key(url: str) -> str:
    """The held-out list's normalised key of a source address: owner/repo#N for a GitHub issue, pull
    request or discussion, owner/repo/path for a file in a repository, else the URL without scheme,
    fragment or trailing slash; lower case."""
    from urllib.parse import urlsplit

    url = url.strip()
    parts = urlsplit(url if "://" in url else f"https://{url}")
    host, path = parts.netloc.lower(), parts.path.rstrip("/")
    if host in {"github.com", "www.github.com"}:
        segments = path.strip("/").split("/")
        if len(segments) >= 4 and segments[2] in {"issues", "pull", "pulls", "discussions"}:
            return f"{segments[0]}/{segments[1]}#{segments[3]}".lower()
        if len(segments) >= 5 and segments[2] in {"blob", "tree"}:
            return "/".join(segments[:2] + segments[4:]).lower()
    return f"{host}{path}{'?' + parts.query if parts.query else ''}".lower()


def test_thread_key_normalises_as_the_held_out_list_says():
    assert thread_key("https://github.com/NVIDIA/nccl/issues/905#issuecomment-1") == "nvidia/nccl#905"
    assert thread_key("https://github.com/NVIDIA/nccl/pull/905/") == "nvidia/nccl#905"
    assert thread_key("https://github.com/o/r/blob/main/docs/x.md") == "o/r/docs/x.md"
    assert thread_key("https://Forums.Example.com/t/gpu-lost/12/#reply") == "forums.example.com/t/gpu-lost/12"


def test_no_bundled_report_cites_a_held_out_thread(bundled):
    import hashlib

    listing = shared_file("data/heldout_threads.sha256").read_text(encoding="utf-8")
    assert listing.startswith(HELD_OUT_HEADER), "the list's header states the key rule this test applies"
    held_out = {line.strip() for line in listing.splitlines() if line.strip() and not line.startswith("#")}
    incidents, _ = bundled
    cited = [(i.id, i.source) for i in incidents if i.source.startswith("http")]
    assert len(cited) > 300
    hits = [(ident, source) for ident, source in cited
            if hashlib.sha256(thread_key(source).encode()).hexdigest() in held_out]
    assert hits == [], f"{len(hits)} bundled reports cite a held-out thread: {hits[:5]}"
