"""A team's own taxonomy with other ids keeps every feature: what the code keys on is a flag.

Every id of the bundled taxonomy is renamed (``dim00``, ``sym03``, ``mit01``, ``rc12`` ...); the
suspect-node steps, the low-GPU-utilisation hints, retry safety and the badge colours still work,
in the mitigation functions and in a whole engine over a small hashing-embedder knowledge base.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from conftest import LABELLED, make_settings

from kb.core.incidents import Incident
from kb.core.settings import DATA_DIR
from kb.core.suggestion import Evidence, Ticket
from kb.core.taxonomy import load_low_util_taxonomy, load_taxonomy, parse_taxonomy
from kb.engine.classify import Calibration
from kb.engine.knowledge import KnowledgeBase
from kb.engine.mitigate import low_utilisation_hints, rank_mitigations, wants_low_utilisation_hints
from kb.engine.suggest import SuggestionEngine

KINDS = {"dimensions": "dim", "symptoms": "sym", "mitigations": "mit", "root_causes": "rc"}
GPU_LOST_TICKET = Ticket(id="t-gpu", title="Job died on gn-311, a GPU vanished",
                         description="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus on gn-311; "
                                     "nvidia-smi lists 7 GPUs.")


def renamed_taxonomy_raw() -> tuple[dict, dict[str, str]]:
    """The bundled taxonomy with every id renamed, and the map old id -> new id."""
    raw = yaml.safe_load((DATA_DIR / "taxonomy.yaml").read_text())
    new: dict[str, str] = {}
    for kind, prefix in KINDS.items():
        for n, item in enumerate(raw[kind]):
            new[item["id"]] = item["id"] = f"{prefix}{n:02d}"
    for cause in raw["root_causes"]:
        cause["dimension"] = new[cause["dimension"]]
        cause["default_mitigations"] = [new[m] for m in cause["default_mitigations"]]
    for item in raw["published_interruptions"]:
        item["maps_to"] = new.get(item["maps_to"]) if item["maps_to"] else None
    raw["name"] = "team-taxonomy"
    return raw, new


def write_renamed(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """The renamed taxonomy and the log signatures speaking its ids, written under tmp_path."""
    raw, new = renamed_taxonomy_raw()
    taxonomy = tmp_path / "team-taxonomy.yaml"
    taxonomy.write_text(yaml.safe_dump(raw, sort_keys=False))
    sigs = yaml.safe_load((DATA_DIR / "signatures.yaml").read_text())
    for sig in sigs["signatures"]:
        sig["causes"] = {new[c]: w for c, w in (sig.get("causes") or {}).items()}
        sig["symptoms"] = {new[s]: w for s, w in (sig.get("symptoms") or {}).items()}
    signatures = tmp_path / "team-signatures.yaml"
    signatures.write_text(yaml.safe_dump(sigs, sort_keys=False))
    return taxonomy, signatures, new


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    """(taxonomy path, signatures path, old id -> new id)."""
    return write_renamed(tmp_path_factory.mktemp("team"))


def test_the_flags_follow_the_entries_not_their_ids(renamed):
    tax_path, _, new = renamed
    bundled, tax = load_taxonomy(DATA_DIR / "taxonomy.yaml"), load_taxonomy(tax_path)
    assert tax.low_utilisation_symptoms == {new[s] for s in bundled.low_utilisation_symptoms} == {new["job_slowdown"]}
    assert tax.node_exclusion_mitigations == {new["job_resubmission"], new["node_repair"]}
    assert tax.suspect_node_dimensions == {new["hardware"]}
    assert tax.suspect_node_causes == {new[c] for c in bundled.suspect_node_causes}
    assert new["gpu_lost"] in tax.suspect_node_causes and new["buggy_code"] not in tax.suspect_node_causes
    assert tax.retry_safe_causes == {new[c] for c in bundled.retry_safe_causes}
    assert tax.dimension_colour(new["hardware"]) == "red" and tax.dimension_colour("nowhere") == "gray"
    assert tax.missing_features() == []


def test_the_suspect_node_step_follows_the_flag(renamed):
    tax_path, _, new = renamed
    tax = load_taxonomy(tax_path)
    steps = rank_mitigations(tax, [(new["gpu_lost"], 1.0)], [], {"node": "gn-311", "gpu": "3"})
    by_id = {s.id: s.next_step for s in steps}
    assert by_id[new["node_repair"]].endswith("Suspect node: gn-311, GPU 3.")
    assert by_id[new["job_resubmission"]].endswith("Suspect node: gn-311, GPU 3.")
    others = rank_mitigations(tax, [(new["buggy_code"], 1.0)], [], {"node": "gn-311"})
    assert others and not any("Suspect node" in s.next_step for s in others
                              if s.id not in tax.node_exclusion_mitigations)


def test_the_low_utilisation_hints_follow_the_flag(renamed):
    tax = load_taxonomy(renamed[0])
    slow, crash = renamed[2]["job_slowdown"], renamed[2]["job_crash"]
    assert wants_low_utilisation_hints(tax, slow, [])
    assert not wants_low_utilisation_hints(tax, crash, [])
    signal = Evidence(signal="s", text="t", category=None, causes={}, explanation="e", start=0, end=1,
                      low_gpu_utilisation="gpu_oversubscription")
    assert wants_low_utilisation_hints(tax, crash, [signal])
    low_util = load_low_util_taxonomy(DATA_DIR / "low_gpu_utilisation.yaml")
    hints = low_utilisation_hints(low_util, [], "requested 8 GPUs, only GPU 0 busy")
    assert hints[0].id == "gpu_oversubscription"


def test_a_taxonomy_that_flags_nothing_loads_and_says_what_it_turns_off(tmp_path, caplog):
    raw, _ = renamed_taxonomy_raw()
    for kind, flag in (("dimensions", "suspect_node"), ("symptoms", "low_gpu_utilisation"),
                       ("mitigations", "excludes_node"), ("root_causes", "retry_safe")):
        for item in raw[kind]:
            item.pop(flag, None)
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(raw))
    with caplog.at_level(logging.WARNING, logger="kb.core.taxonomy"):
        tax = load_taxonomy(path)
    assert len(tax.missing_features()) == 4
    for flag in ("suspect_node", "excludes_node", "low_gpu_utilisation", "retry_safe"):
        assert f"{flag}: true" in caplog.text


def test_an_unknown_badge_colour_is_refused_naming_the_dimension():
    raw, new = renamed_taxonomy_raw()
    raw["dimensions"][0]["colour"] = "mauve"
    with pytest.raises(ValueError, match=f"'{new['hardware']}' > colour"):
        parse_taxonomy(raw)


def _labelled(new: dict[str, str]) -> list[Incident]:
    out = []
    for line in LABELLED.read_text().splitlines():
        rec = json.loads(line)
        out.append(Incident(id=rec["id"], title=rec["title"], description=rec["description"],
                            resolution=rec["resolution"], source=rec["source"], symptom=new[rec["symptom"]],
                            root_cause=new[rec["root_cause"]], mitigation=new[rec["mitigation"]]))
    return out


@pytest.fixture(scope="module")
def team_engine(renamed, tmp_path_factory) -> SuggestionEngine:
    """An engine over the twenty test incidents relabelled in the renamed taxonomy (hashing embedder)."""
    tax_path, sig_path, new = renamed
    home = tmp_path_factory.mktemp("team-kb") / "kb"
    kb = KnowledgeBase(make_settings(home, embedder="hashing", taxonomy=tax_path, signatures=sig_path))
    report = kb.add_incidents(_labelled(new))
    assert report.added == 20 and not report.errors
    Calibration().save(home / "calibration.json")
    return SuggestionEngine(kb)


def test_the_engine_names_the_suspect_node_under_a_renamed_taxonomy(team_engine, renamed):
    new = renamed[2]
    s = team_engine.suggest(GPU_LOST_TICKET)
    assert s.suspect and s.suspect["node"] == "gn-311"
    assert s.root_cause in team_engine.kb.taxonomy.cause_ids
    named = [m for m in s.mitigations if m.id in {new["node_repair"], new["job_resubmission"]}]
    assert named and all("Suspect node: gn-311" in m.next_step for m in named)


def test_the_engine_gives_low_utilisation_hints_under_a_renamed_taxonomy(team_engine, renamed):
    slow = renamed[2]["job_slowdown"]
    s = team_engine.suggest(Ticket(id="t-slow", title="Training throughput dropped, job slowdown",
                                   description="Step time doubled and GPU utilisation below 50% since Monday; "
                                               "throughput dropped from 900 to 400 samples/s."))
    assert s.symptom == slow
    assert s.low_gpu_utilisation
