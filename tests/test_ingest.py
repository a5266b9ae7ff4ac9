"""Every reader turns its source into Incidents; bad input is reported, never lost silently."""

import json

import pytest

from ingest import IngestError, IngestWarning, read_paths
from ingest.csv_export import parse_mapping
from kb.core.incidents import MAX_TEXT_CHARS, Incident


def _split(items):
    items = list(items)
    return ([i for i in items if isinstance(i, Incident)], [i for i in items if isinstance(i, IngestError)],
            [i for i in items if isinstance(i, IngestWarning)])


def _record(n, **kw):
    return {"id": f"t-{n}", "title": f"job {n} died", "description": f"Xid 79 on node gpu-{n}",
            "root_cause": "gpu_lost", "symptom": "job_crash", "mitigation": "node_repair", **kw}


def test_jsonl_reads_all_records(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(json.dumps(_record(n)) for n in range(3)) + "\n")
    incidents, errors, _ = _split(read_paths([path]))
    assert [i.id for i in incidents] == ["t-0", "t-1", "t-2"] and not errors
    assert incidents[0].root_cause == "gpu_lost" and incidents[0].source == "a.jsonl:1"


def test_truncated_jsonl_line_is_reported_with_line_number(tmp_path):
    path = tmp_path / "cut.jsonl"
    lines = [json.dumps(_record(n)) for n in range(3)]
    lines[1] = lines[1][:25]
    path.write_text("\n".join(lines))
    incidents, errors, _ = _split(read_paths([path]))
    assert [i.id for i in incidents] == ["t-0", "t-2"]
    assert len(errors) == 1 and errors[0].where == "line 2" and "malformed JSON" in errors[0].message
    assert "cut.jsonl" in str(errors[0])


def test_latin1_file_is_read_with_a_warning(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(_record(1, title="Kühlung ausgefallen, Knoten überhitzt"),
                                ensure_ascii=False).encode("latin-1"))
    incidents, errors, warnings = _split(read_paths([path]))
    assert incidents[0].title == "Kühlung ausgefallen, Knoten überhitzt" and not errors
    assert "not valid UTF-8" in warnings[0].message


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.csv", "empty.json"])
def test_empty_file_is_an_error(tmp_path, name):
    path = tmp_path / name
    path.write_text("")
    incidents, errors, _ = _split(read_paths([path]))
    assert not incidents and "empty file" in errors[0].message


def test_huge_description_is_trimmed_not_dropped(tmp_path):
    path = tmp_path / "huge.jsonl"
    body = "start " + "x" * (5 * 1024 * 1024) + " the end"
    path.write_text(json.dumps(_record(1, description=body)))
    incidents, errors, _ = _split(read_paths([path]))
    assert not errors and len(incidents[0].description) <= MAX_TEXT_CHARS
    assert incidents[0].description.startswith("start") and incidents[0].description.endswith("the end")
    assert "characters trimmed" in incidents[0].description


def test_record_without_text_or_id(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "x"}) + "\n" + json.dumps({"title": "t"}) + "\n[1, 2]\n")
    _, errors, _ = _split(read_paths([path]))
    assert [e.where for e in errors] == ["line 1", "line 2", "line 3"]
    assert "neither a title nor a description" in errors[0].message
    assert "no id" in errors[1].message and "JSON object" in errors[2].message


def test_json_array(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([_record(1), _record(2)]))
    incidents, errors, _ = _split(read_paths([path]))
    assert [i.id for i in incidents] == ["t-1", "t-2"] and not errors


JIRA_CSV = (
    "Issue key,Summary,Description,Labels,Labels,Created,Custom field (Root Cause)\n"
    "OPS-1,Pods pending,\"0/8 nodes available: 8 Insufficient nvidia.com/gpu\",k8s,gpu,2024-03-01 10:00,"
    "resource_overload\n"
    "OPS-2,Import fails,\"ModuleNotFoundError: No module named 'apex'\",,,2024-03-02 11:00,\n"
)


def test_jira_csv_export(tmp_path):
    path = tmp_path / "jira.csv"
    path.write_text(JIRA_CSV)
    incidents, errors, _ = _split(read_paths([path]))
    assert not errors and [i.id for i in incidents] == ["OPS-1", "OPS-2"]
    assert incidents[0].tags == ["k8s", "gpu"] and incidents[0].root_cause == "resource_overload"
    assert incidents[1].root_cause is None and incidents[0].created_at.year == 2024


def test_csv_with_missing_columns_names_them(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("Ticket,Text\n1,GPU died\n")
    incidents, errors, _ = _split(read_paths([path]))
    assert not incidents
    assert "missing required column(s)" in errors[0].message and "'Issue key'" in errors[0].message
    assert "Ticket, Text" in errors[0].message


def test_csv_mapping_is_configurable(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("Ticket,Headline,Text\n1,GPU died,Xid 48 on gpu-3\n")
    incidents, errors, _ = _split(read_paths([path], parse_mapping(["id=Ticket", "title=Headline",
                                                                     "description=Text"])))
    assert not errors and incidents[0].id == "1" and incidents[0].description == "Xid 48 on gpu-3"
    with pytest.raises(ValueError, match="unknown field 'colour'"):
        parse_mapping(["colour=Red"])


def test_markdown_postmortems_folder(tmp_path):
    folder = tmp_path / "pm"
    folder.mkdir()
    (folder / "2024-05-ib-flap.md").write_text(
        "---\nsymptom: job_hang\nroot_cause: infiniband_failure\nmitigation: node_repair\ntags: [ib]\n---\n"
        "# Training hung after IB port flap\n\nAll ranks stuck in allreduce; mlx5_0 port 1 went down.\n\n"
        "## Resolution\nReplaced the cable on leaf-3 port 17 and resubmitted.\n")
    (folder / "broken.md").write_text("---\nroot_cause: [unclosed\n---\n# x\n")
    incidents, errors, _ = _split(read_paths([folder]))
    assert len(incidents) == 1 and incidents[0].id == "2024-05-ib-flap"
    assert incidents[0].title == "Training hung after IB port flap"
    assert "allreduce" in incidents[0].description and "Replaced the cable" in incidents[0].resolution
    assert incidents[0].root_cause == "infiniband_failure" and incidents[0].tags == ["ib"]
    assert "broken.md" in errors[0].file and "front matter" in errors[0].where


def test_github_issues_export(tmp_path):
    issues = [
        {"number": 12, "node_id": "I_1", "html_url": "https://github.com/acme/cluster/issues/12",
         "title": "NCCL timeout on 64 GPUs", "body": "Watchdog caught collective operation timeout",
         "labels": [{"name": "rc:infiniband_failure"}, {"name": "symptom:job_hang"}, {"name": "triage"}],
         "created_at": "2024-02-01T10:00:00Z", "state": "closed"},
        {"number": 13, "node_id": "PR_1", "html_url": "https://github.com/acme/cluster/pull/13",
         "title": "fix", "body": "", "labels": [], "pull_request": {"url": "x"}},
    ]
    path = tmp_path / "issues.json"
    path.write_text(json.dumps(issues))
    incidents, errors, _ = _split(read_paths([path]))
    assert not errors and len(incidents) == 1
    assert incidents[0].id == "acme/cluster#12" and incidents[0].root_cause == "infiniband_failure"
    assert incidents[0].symptom == "job_hang" and incidents[0].tags == ["triage"]


def test_unsupported_and_missing_paths(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    _, errors, _ = _split(read_paths([tmp_path / "x.txt", tmp_path / "nope.jsonl"]))
    assert "unsupported file type .txt" in errors[0].message and "no such file" in errors[1].message


TOKEN = "ghp_" + "Ab1" * 12  # a GitHub token shape


def test_error_messages_quote_records_redacted(tmp_path):
    path = tmp_path / "leaky.jsonl"
    cut = '{"id": "t-1", "title": "pull failed", "description": "tok ' + TOKEN + ' and password: hunter22!'
    assert cut.index(TOKEN) < 60 < cut.index(TOKEN) + len(TOKEN)  # the snippet would cut the token in two
    no_text = json.dumps({"id": "dump-alice@example.com", "title": ""})
    bad_field = json.dumps({"id": "ops@example.com", "title": "x", "provenance": "guess"})
    path.write_text("\n".join([cut, no_text, bad_field]) + "\n")
    _, errors, _ = _split(read_paths([path]))
    assert len(errors) == 3 and "malformed JSON" in errors[0].message
    text = "\n".join(str(e) for e in errors)
    assert "ghp_" not in text and "Ab1Ab1" not in text and "hunter22" not in text
    assert "alice@example.com" not in text and "ops@example.com" not in text
    assert "tok [R" in errors[0].message and "[REDACTED:EMAIL]" in errors[1].message


def test_front_matter_errors_quote_the_file_redacted(tmp_path):
    (tmp_path / "pm.md").write_text("---\nowner: ops@example.com\npassword: hunter22!: [unclosed\n---\n# x\n")
    _, errors, _ = _split(read_paths([tmp_path / "pm.md"]))
    assert len(errors) == 1 and "not valid YAML" in errors[0].message
    assert "hunter22" not in errors[0].message and "ops@example.com" not in errors[0].message
