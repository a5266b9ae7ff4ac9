"""Readings: the vocabulary and labelled readings load and fit together, the reader learns scope and
change from them and shows the words it read them from (kb/core/readings.py, kb/engine/readings.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from kb.core.incidents import Incident
from kb.core.readings import KINDS, UNKNOWN, ReadingLabel, ReadingsError, load_labels, load_vocabulary
from kb.core.settings import DATA_DIR, Settings
from kb.core.suggestion import Ticket
from kb.core.taxonomy import load_taxonomy
from kb.engine.readings import reading_feature, reading_table, sentences

TAXONOMY = load_taxonomy(DATA_DIR / "taxonomy.yaml")
VOCABULARY = load_vocabulary(DATA_DIR / "readings.yaml", TAXONOMY)


def test_the_bundled_vocabulary_has_each_reading_with_unknown_and_points_to_dimensions():
    dimensions = {d.id for d in TAXONOMY.dimensions}
    for kind in KINDS:
        assert UNKNOWN in VOCABULARY.ids(kind) and len(VOCABULARY.ids(kind)) >= 5
        assert {v.points_to for v in VOCABULARY.values(kind)} - {None} <= dimensions
    assert {v.points_to for v in VOCABULARY.values("scope")} >= {"user", "hardware", "platform"}


def test_every_bundled_report_has_labelled_readings_whose_words_are_in_its_ticket(tmp_path):
    from kb.engine.knowledge import KnowledgeBase

    labels = load_labels(DATA_DIR / "reading_labels.jsonl", VOCABULARY)
    incidents = {i.id: i for i in KnowledgeBase(Settings(home=tmp_path)).bundled_incidents()}
    assert set(labels) == set(incidents)
    for label in labels.values():
        text = incidents[label.id].text()
        for kind in KINDS:
            span = getattr(label, f"{kind}_span")
            assert span in text, (label.id, kind, span)
            assert bool(span) or getattr(label, kind) == UNKNOWN or kind == "scope", label.id
    second = [label for label in labels.values() if label.second]
    assert len(second) >= 200, "a blind second pass labels a sample, to measure agreement"
    assert all(set(label.second) >= {"scope", "change"} for label in second)


def _write(tmp_path, data, name="readings.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if name.endswith(".yaml") else data)
    return path


def _vocabulary_dict():
    return yaml.safe_load((DATA_DIR / "readings.yaml").read_text())


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["scope"].append(dict(d["scope"][0])), "repeated ids"),
    (lambda d: d.update(change=[v for v in d["change"] if v["id"] != UNKNOWN]), "'unknown'"),
    (lambda d: d["scope"][0].update(points_to="network"), "not a dimension"),
    (lambda d: d["scope"][0].update(id="One Job"), "scope"),
    (lambda d: d.pop("change"), "change"),
])
def test_a_broken_vocabulary_names_the_file_and_the_problem(tmp_path, change, message):
    data = _vocabulary_dict()
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(ReadingsError, match=message) as failed:
        load_vocabulary(path, TAXONOMY)
    assert str(path) in str(failed.value)


def test_a_bad_label_names_its_line(tmp_path):
    good = {"id": "a", "scope": "one_job", "change": UNKNOWN}
    lines = [json.dumps(good), json.dumps({**good, "id": "b", "scope": "everyone"}), "{broken"]
    path = _write(tmp_path, "\n".join(lines[:2]), "labels.jsonl")
    with pytest.raises(ReadingsError, match=r"line 2: scope 'everyone' is not in the vocabulary"):
        load_labels(path, VOCABULARY)
    path = _write(tmp_path, "\n".join([lines[0], lines[2]]), "labels.jsonl")
    with pytest.raises(ReadingsError, match="line 2: not a readings label"):
        load_labels(path, VOCABULARY)


def test_the_reading_table_says_which_causes_a_value_goes_with():
    causes = ["service_outage", "buggy_code"]
    incidents = [Incident(id=f"o{n}", title="t", root_cause="service_outage") for n in range(30)]
    incidents += [Incident(id=f"b{n}", title="t", root_cause="buggy_code") for n in range(30)]
    labels = {i.id: ReadingLabel(id=i.id, scope="whole_cluster" if i.root_cause == "service_outage" else "one_job",
                                 change=UNKNOWN) for i in incidents}
    table = reading_table(incidents, labels, VOCABULARY, causes)
    row = table["scope"][VOCABULARY.ids("scope").index("whole_cluster")]
    assert row[0] > 1.5 > 0.5 > row[1]
    assert np.allclose(table["change"][VOCABULARY.ids("change").index(UNKNOWN)], 1.0)  # says nothing
    sure = np.eye(len(VOCABULARY.ids("scope")))[VOCABULARY.ids("scope").index("whole_cluster")]
    feature = reading_feature({"scope": sure}, table)
    assert feature[0] > 0 > feature[1]
    assert list(reading_feature({}, table)) == [0.0, 0.0]


def test_the_experts_readings_give_the_feature_a_sure_reader_would(tmp_path):
    """The upper bound of the readings lever (``pmkb calibrate``): each labelled incident's feature
    from its expert's readings, as if the reader were certain of them; none for an unlabelled one."""
    from types import SimpleNamespace

    from kb.engine.calibrate import Calibrator

    incidents = [Incident(id=f"o{n}", title="t", root_cause="service_outage") for n in range(30)]
    incidents += [Incident(id=f"b{n}", title="t", root_cause="buggy_code") for n in range(30)]
    lines = [json.dumps({"id": i.id, "scope": "whole_cluster" if i.root_cause == "service_outage" else "one_job",
                         "change": UNKNOWN}) for i in incidents]
    settings = Settings(home=tmp_path, reading_labels=_write(tmp_path, "\n".join(lines), "labels.jsonl"))
    calibrator = Calibrator(SimpleNamespace(settings=settings, taxonomy=TAXONOMY))
    outage, bug = TAXONOMY.cause_ids.index("service_outage"), TAXONOMY.cause_ids.index("buggy_code")
    unlabelled = Incident(id="new", title="t", root_cause="buggy_code")
    columns = calibrator.expert_readings(incidents, [incidents[0], incidents[-1], unlabelled])
    assert columns[0][outage] > 0 > columns[0][bug] and columns[1][bug] > 0 > columns[1][outage]
    assert columns[2] is None and len(columns[0]) == len(TAXONOMY.cause_ids)


def test_sentences_keep_their_offsets():
    text = "Title line\nAll users fail since 9:00; nothing changed on our side. OK"
    pieces = sentences(text)
    assert [p for _, p in pieces] == ["Title line", "All users fail since 9:00;", "nothing changed on our side."]
    assert all(text[start:start + len(p)] == p for start, p in pieces)


@pytest.mark.slow
def test_the_engine_reads_scope_and_change_and_quotes_the_ticket(shared_bundled_kb):
    from kb.engine.suggest import SuggestionEngine

    engine = SuggestionEngine(shared_bundled_kb)
    ticket = Ticket(title="Nobody can submit jobs since the scheduler upgrade this morning",
                    description="Since the Slurm upgrade at 08:00 every user on the cluster gets "
                                "'sbatch: error: Batch job submission failed: Socket timed out'. "
                                "Jobs of all teams are affected.")
    suggestion = engine.suggest(ticket)
    readings = {r.kind: r for r in suggestion.readings}
    assert set(readings) == set(KINDS)
    assert readings["scope"].id in {"many_users", "whole_cluster"} and readings["scope"].points_to == "platform"
    assert readings["change"].id == "platform_change"
    for r in readings.values():
        assert r.span and r.span in ticket.text() and 0 < r.confidence <= 1
    assert json.loads(suggestion.model_dump_json())["readings"][0]["kind"] == "scope"


def test_scope_and_change_are_read_from_the_reporters_words_never_from_the_log(shared_bundled_kb):
    from kb.engine.suggest import SuggestionEngine

    engine = SuggestionEngine(shared_bundled_kb)
    words = Ticket(title="Nobody can submit jobs since the scheduler upgrade this morning",
                   description="Since the Slurm upgrade at 08:00 every user on the cluster gets "
                               "'sbatch: error: Batch job submission failed: Socket timed out'.")
    log = ("gpu-n01:982:982 [2] NCCL INFO NCCL_SOCKET_IFNAME set by environment to bond0\n"
           "I changed my training script and my config yesterday, only my job fails.\n" * 20)
    with_log = engine.suggest(words.model_copy(update={"log": log}))
    alone = engine.suggest(words)
    prose = f"{words.title}\n{words.description}"
    for r in with_log.readings:
        assert r.span and r.span in prose, r  # never a line of the log, however it reads
    assert [(r.id, r.span) for r in with_log.readings] == [(r.id, r.span) for r in alone.readings]
