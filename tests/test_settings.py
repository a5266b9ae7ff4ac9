"""Settings: defaults < YAML config file (--config or PMKB_CONFIG) < PMKB_* variables < values in code."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.core.settings import DATA_DIR, Settings, load_settings


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pmkb.yaml"
    path.write_text(text)
    return path


def test_each_source_wins_over_the_ones_before_it(tmp_path, monkeypatch):
    config = _config(tmp_path, "neighbours: 3\nabstain_threshold: 0.5\nmin_ticket_words: 9\nembedder: hashing\n")
    monkeypatch.setenv("PMKB_ABSTAIN_THRESHOLD", "0.6")
    monkeypatch.setenv("PMKB_MIN_TICKET_WORDS", "7")
    s = load_settings(config, min_ticket_words=2, home=None)
    assert s.neighbours == 3 and s.embedder == "hashing"  # file over defaults
    assert s.abstain_threshold == 0.6  # environment over file
    assert s.min_ticket_words == 2  # values in code over environment
    assert s.taxonomy == DATA_DIR / "taxonomy.yaml" and s.home == Settings().home  # defaults, None ignored


def test_the_config_file_may_come_from_pmkb_config(tmp_path, monkeypatch):
    monkeypatch.setenv("PMKB_CONFIG", str(_config(tmp_path, "neighbours: 4\n")))
    assert load_settings().neighbours == 4
    assert load_settings(_config(tmp_path / "..", "neighbours: 6\n")).neighbours == 6  # --config wins
    assert Settings().neighbours == 8  # only load_settings reads a config file


def test_an_empty_config_file_keeps_the_defaults(tmp_path):
    assert load_settings(_config(tmp_path, "")) == Settings()


@pytest.mark.parametrize(("text", "message"), [
    (None, "cannot read config file .*missing.yaml"),
    ("neighbours: [1\n", "cannot read config file .*pmkb.yaml"),
    ("- neighbours\n- 3\n", "config file .*pmkb.yaml must hold a mapping of setting names to values"),
])
def test_a_bad_config_file_is_named_with_its_problem(tmp_path, text, message):
    path = tmp_path / "missing.yaml" if text is None else _config(tmp_path, text)
    with pytest.raises(ValueError, match=message):
        load_settings(path)


def test_an_unknown_setting_in_the_file_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="neighbors"):
        load_settings(_config(tmp_path, "neighbors: 3\n"))


@pytest.mark.parametrize(("variable", "value"), [
    ("PMKB_RATE_LIMIT_BURST", "0"), ("PMKB_RATE_LIMIT_PER_SECOND", "0"), ("PMKB_QUEUE_BACKOFF", "-1"),
    ("PMKB_MAX_REQUEST_BYTES", "-5"), ("PMKB_REQUEST_READ_TIMEOUT", "-1"), ("PMKB_QUEUE_MAX_ATTEMPTS", "0"),
    ("PMKB_ABSTAIN_THRESHOLD", "7"), ("PMKB_NEIGHBOURS", "-3"), ("PMKB_WRITEBACK_TIMEOUT", "0"),
    ("PMKB_QUEUE_RETRY_BUDGET_HOURS", "0"), ("PMKB_QUEUE_RETENTION_DAYS", "-2"), ("PMKB_LLM_TIMEOUT", "0"),
    ("PMKB_HEADER_TIMEOUT", "0"), ("PMKB_MAX_CONNECTIONS", "3"), ("PMKB_MAX_CALLS_PER_CLIENT", "0"),
    ("PMKB_ATTACHMENT_MAX_BYTES", "0"), ("PMKB_ATTACHMENT_TIMEOUT", "-1"), ("PMKB_ATTACHMENT_HOSTS", "https://x/"),
])
def test_an_out_of_range_setting_is_refused_naming_it(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as refused:
        load_settings()
    message = str(refused.value)
    assert variable in message and repr(value) in message and "\n" not in message


def test_a_secret_that_fails_is_not_echoed(monkeypatch, tmp_path):
    config = tmp_path / "pmkb.yaml"
    config.write_text("github_token: [not, a, string, s3cr3t-value]\n")
    with pytest.raises(ValueError) as refused:
        load_settings(config)
    assert "github_token" in str(refused.value) and "s3cr3t" not in str(refused.value)


def test_the_defaults_are_in_range():
    settings = load_settings()
    assert settings.rate_limit_burst >= 1 and 0 <= settings.abstain_threshold <= 1
