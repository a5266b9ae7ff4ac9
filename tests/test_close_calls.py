"""The bundled close calls load against the bundled taxonomy, cover the common confusions and ask
checkable questions; broken files fail naming the entry and the problem; a team's own file loads."""

import re

import pytest
import yaml

from kb.core.close_calls import CloseCallsError, load_close_calls
from kb.core.settings import DATA_DIR
from kb.core.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy(DATA_DIR / "taxonomy.yaml")
BUNDLED = load_close_calls(DATA_DIR / "close_calls.yaml", TAXONOMY)

# Pairs the engine most often confuses (truth, predicted); each must have its question.
CONFUSED = [
    ("platform_misconfiguration", "improper_configuration"),
    ("platform_misconfiguration", "infiniband_failure"),
    ("service_outage", "resource_overload"),
    ("system_defect", "improper_configuration"),
    ("system_defect", "improper_permission"),
    ("system_defect", "platform_maintenance"),
    ("policy_violation", "buggy_code"),
    ("improper_configuration", "buggy_code"),
    ("improper_configuration", "environment_dependency"),
    ("environment_dependency", "incompatible_platform_software"),
    ("node_outage", "system_defect"),
    ("node_outage", "platform_maintenance"),
    ("node_outage", "host_cpu_memory_failure"),
    ("nic_failure", "service_outage"),
    ("nic_failure", "environment_dependency"),
    ("disk_failure", "system_defect"),
    ("gpu_thermal_power", "gpu_lost"),
    ("gpu_memory_error", "node_outage"),
    ("gpu_processor_fault", "buggy_code"),
    ("incompatible_platform_software", "gpu_processor_fault"),
    ("platform_misconfiguration", "network_switch_cable"),
    ("resource_overload", "policy_violation"),
    ("platform_maintenance", "buggy_code"),
    ("system_defect", "platform_misconfiguration"),
    ("gpu_lost", "platform_misconfiguration"),
    ("nic_failure", "platform_misconfiguration"),
    ("disk_failure", "service_outage"),
    ("platform_maintenance", "platform_misconfiguration"),
    ("gpu_processor_fault", "host_cpu_memory_failure"),
    ("environment_dependency", "gpu_nvlink_error"),
]

# Something an engineer can look at: a command, a log, a dashboard, a counter, the calendar.
CHECKABLE = re.compile(r"`[^`]+`|dashboard|panel|\blogs?\b|status|health|calendar|counters?|events?", re.I)


def test_bundled_file_has_at_least_twenty_pairs():
    assert len(BUNDLED) >= 20


@pytest.mark.parametrize(("truth", "predicted"), CONFUSED, ids=["/".join(p) for p in CONFUSED])
def test_every_common_confusion_has_a_question(truth, predicted):
    assert BUNDLED.question_for(truth, predicted) is not None


@pytest.mark.parametrize("entry", BUNDLED.entries, ids=["/".join(e.causes) for e in BUNDLED.entries])
def test_bundled_question_is_checkable_and_answers_differ(entry):
    assert entry.question.endswith("?")
    assert entry.question.count("?") == 1, "one question, not several"
    assert CHECKABLE.search(entry.question), "the question names nothing to check"
    first, second = (entry.answer_for(cause) for cause in entry.causes)
    assert first and second and first != second


def test_lookup_is_order_free():
    entry = BUNDLED.question_for("gpu_lost", "gpu_thermal_power")
    assert entry is BUNDLED.question_for("gpu_thermal_power", "gpu_lost")
    assert entry.answer_for("gpu_lost") != entry.answer_for("gpu_thermal_power")
    assert BUNDLED.question_for("gpu_lost", "policy_violation") is None


def _entry(a, b, answers=None):
    return {"causes": [a, b], "question": f"Does `check` tell {a} from {b}?",
            "answers": answers if answers is not None else {a: f"points to {a}", b: f"points to {b}"}}


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def _write(tmp_path, content):
    path = tmp_path / "close_calls.yaml"
    # pmkb refuses YAML aliases, which safe_dump writes for objects used twice: write them out
    path.write_text(yaml.dump(content, Dumper=_NoAliases), encoding="utf-8")
    return path


GOOD = _entry("gpu_lost", "nic_failure")


@pytest.mark.parametrize(("bad", "problem"), [
    (_entry("gpu_lost", "no_such_cause"), "unknown root cause 'no_such_cause'"),
    (_entry("gpu_lost", "gpu_lost"), "same cause twice"),
    (_entry("gpu_lost", "disk_failure", {"gpu_lost": "x", "node_outage": "y"}), "answers must name exactly"),
    (_entry("nic_failure", "gpu_lost"), r"duplicate pair gpu_lost / nic_failure, already given as entry 1"),
    ({**GOOD, "causes": ["gpu_lost", "disk_failure"], "note": "x"}, "note: Extra inputs are not permitted"),
    ({**_entry("gpu_lost", "disk_failure"), "question": "  "}, "question: String should have at least 1"),
    ({**GOOD, "causes": ["gpu_lost"]}, "causes: must be a list of two root-cause ids"),
    (["not", "a", "mapping"], "expected a mapping"),
], ids=["unknown cause", "same cause twice", "third cause answered", "duplicate pair reversed",
        "unknown field", "empty question", "one cause", "entry not a mapping"])
def test_bad_entry_is_named_with_its_problem(tmp_path, bad, problem):
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(CloseCallsError, match=rf"{re.escape(str(path))}: entry 2: .*{problem}"):
        load_close_calls(path, TAXONOMY)


def test_file_that_is_not_a_list_fails(tmp_path):
    path = _write(tmp_path, {"close_calls": [GOOD]})
    with pytest.raises(CloseCallsError, match=rf"{re.escape(str(path))}: expected a list of entries"):
        load_close_calls(path, TAXONOMY)


def test_missing_file_fails_naming_it(tmp_path):
    with pytest.raises(CloseCallsError, match="nowhere.yaml: file not found"):
        load_close_calls(tmp_path / "nowhere.yaml", TAXONOMY)


def test_team_file_with_its_own_pair_loads(tmp_path):
    own = {"causes": ["gpu_nvlink_error", "platform_misconfiguration"],
           "question": "Is nv-fabricmanager running on the node (`systemctl status nvidia-fabricmanager`)?",
           "answers": {"gpu_nvlink_error": "It runs, and `nvidia-smi nvlink -s` shows a link down.",
                       "platform_misconfiguration": "It is not enabled in the node image of this pool."}}
    team = load_close_calls(_write(tmp_path, [own]), TAXONOMY)
    entry = team.question_for("platform_misconfiguration", "gpu_nvlink_error")
    assert len(team) == 1 and entry.question == own["question"]
    assert entry.answer_for("gpu_nvlink_error") == own["answers"]["gpu_nvlink_error"]
