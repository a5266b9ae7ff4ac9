"""YAML without aliases and with a size bound (kb/core/yamlsafe.py), in every reader of YAML:
data files, the config file and a postmortem's front matter."""

from __future__ import annotations

import time

import pytest
import yaml

from kb.core.close_calls import CloseCallsError, load_close_calls
from kb.core.settings import DATA_DIR, load_settings
from kb.core.taxonomy import load_taxonomy
from kb.core.yamlsafe import MAX_YAML_BYTES, load_yaml

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join(['*' + chr(97 + n)] * 9)}]\n" for n in range(8))
"""Under 500 bytes that a plain safe_load expands into 9**9 (387 million) strings when used."""


def test_an_alias_is_refused_with_its_line_and_quickly():
    assert len(LAUGHS) < 600
    started = time.perf_counter()
    with pytest.raises(yaml.YAMLError, match=r"aliases \(\*a\) are not allowed") as refused:
        load_yaml(LAUGHS)
    assert time.perf_counter() - started < 0.5
    assert "line 2" in str(refused.value) and len(str(refused.value)) < 600


def test_plain_yaml_and_anchors_without_aliases_load():
    assert load_yaml("a: &x 1\nb: [2, 3]\n") == {"a": 1, "b": [2, 3]}
    with pytest.raises(yaml.YAMLError, match="accepted"):
        load_yaml("#" * (MAX_YAML_BYTES + 1))
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']")


def test_every_bundled_data_file_loads_without_aliases():
    for path in DATA_DIR.glob("*.yaml"):
        assert load_yaml(path.read_text(encoding="utf-8")) is not None, path


def test_a_close_calls_file_of_aliases_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "close_calls.yaml"
    path.write_text("- " + LAUGHS.replace("\n", "\n  "))
    with pytest.raises(CloseCallsError, match="aliases") as refused:
        load_close_calls(path, load_taxonomy(DATA_DIR / "taxonomy.yaml"))
    assert str(path) in str(refused.value) and len(str(refused.value)) < 1000


def test_a_config_file_of_aliases_is_refused(tmp_path):
    path = tmp_path / "pmkb.yaml"
    path.write_text(LAUGHS)
    with pytest.raises(ValueError, match="aliases"):
        load_settings(path)


def test_a_postmortem_front_matter_of_aliases_is_a_bad_record(tmp_path):
    from ingest.markdown import split_front_matter

    with pytest.raises(ValueError, match="aliases"):
        split_front_matter("---\n" + LAUGHS + "---\n# GPU lost\n")


def test_the_c_reader_and_the_python_reader_agree_and_both_refuse_aliases(monkeypatch):
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: only the Python reader exists")
    texts = {path.name: path.read_text(encoding="utf-8") for path in DATA_DIR.glob("*.yaml")}
    with_c = {name: load_yaml(text) for name, text in texts.items()}
    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    assert {name: load_yaml(text) for name, text in texts.items()} == with_c
    with pytest.raises(yaml.YAMLError, match="aliases"):
        load_yaml(LAUGHS)
