"""The bundled taxonomy holds exactly the reference label space; broken files fail clearly."""

import re

import pytest
import yaml

from kb.core.settings import DATA_DIR
from kb.core.taxonomy import (
    TaxonomyError,
    load_low_util_taxonomy,
    load_taxonomy,
    parse_taxonomy,
)
from tests.conftest import shared_file


def _reference_ids():
    text = shared_file("taxonomy.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    pick = lambda title: next(s for s in sections if s.startswith(title))
    symptoms = re.findall(r"^\| (\w+) \| ", pick("Symptoms"), flags=re.M)
    causes = re.findall(r"^\| \w+ \| \w+ \| (\w+)", pick("Root causes"), flags=re.M)
    mitigations = re.findall(r"^\| (\w+) \| ", pick("Mitigations"), flags=re.M)
    low = re.findall(r"^\| \w+ \| (\w+) \| ", pick("Low GPU"), flags=re.M)
    drop = {"id", "dimension"}
    return ([s for s in symptoms if s not in drop], [c for c in causes if c not in drop],
            [m for m in mitigations if m not in drop], [x for x in low if x not in drop])


def test_bundled_taxonomy_has_exactly_the_reference_ids():
    symptoms, causes, mitigations, low = _reference_ids()
    tax = load_taxonomy(DATA_DIR / "taxonomy.yaml")
    assert len(causes) == 22 and len(symptoms) == 7 and len(mitigations) == 11
    assert sorted(tax.symptom_ids) == sorted(symptoms)
    assert sorted(tax.cause_ids) == sorted(causes)
    assert sorted(tax.mitigation_ids) == sorted(mitigations)
    assert sorted(c.id for c in load_low_util_taxonomy(DATA_DIR / "low_gpu_utilisation.yaml").categories) \
        == sorted(low)


def test_dimensions_and_published_shares():
    tax = load_taxonomy(DATA_DIR / "taxonomy.yaml")
    counts = {d.id: sum(c.dimension == d.id for c in tax.root_causes) for d in tax.dimensions}
    assert counts == {"hardware": 11, "platform": 6, "user": 5}
    assert {d.id: d.share for d in tax.dimensions} == {"hardware": 0.2833, "platform": 0.2833, "user": 0.4334}
    assert tax.mitigation("job_resubmission").share == pytest.approx(0.3472)


def _raw():
    return yaml.safe_load((DATA_DIR / "taxonomy.yaml").read_text())


def test_duplicate_id_is_named():
    raw = _raw()
    raw["root_causes"].append(dict(raw["root_causes"][0]))
    with pytest.raises(TaxonomyError, match="duplicate root cause id.*gpu_memory_error"):
        parse_taxonomy(raw)


def test_unknown_dimension_is_named():
    raw = _raw()
    raw["root_causes"][3]["dimension"] = "cosmic_rays"
    with pytest.raises(TaxonomyError, match=rf"{raw['root_causes'][3]['id']}.*unknown dimension 'cosmic_rays'"):
        parse_taxonomy(raw)


def test_undefined_mitigation_is_named():
    raw = _raw()
    raw["root_causes"][0]["default_mitigations"] = ["pray"]
    with pytest.raises(TaxonomyError, match="names mitigation 'pray'"):
        parse_taxonomy(raw)


def test_unknown_field_names_the_entry():
    raw = _raw()
    raw["symptoms"][1]["colour"] = "red"
    with pytest.raises(TaxonomyError, match=raw["symptoms"][1]["id"]):
        parse_taxonomy(raw)


def test_missing_file_says_how_to_fix(tmp_path):
    with pytest.raises(TaxonomyError, match="PMKB_TAXONOMY"):
        load_taxonomy(tmp_path / "none.yaml")


def test_custom_taxonomy_extends_without_code(tmp_path):
    raw = _raw()
    raw["name"] = "team-tax"
    raw["root_causes"].append({"id": "cosmic_ray", "name": "Cosmic ray", "dimension": "hardware",
                               "group": "gpu", "definition": "A bit flipped by radiation.",
                               "default_mitigations": ["job_resubmission"]})
    path = tmp_path / "tax.yaml"
    path.write_text(yaml.safe_dump(raw))
    tax = load_taxonomy(path)
    assert tax.dimension_of("cosmic_ray") == "hardware" and len(tax.root_causes) == 23
