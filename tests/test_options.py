"""--kb, --config and --taxonomy work before the command and after it, on every command."""

import json

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from kb.core.settings import DATA_DIR
from pmkb.cli import app
from tests.conftest import LABELLED

SHARED_OPTIONS = {"--kb", "--config", "--taxonomy"}


def _commands(group, prefix=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a command group
            yield from _commands(command, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), command


def test_every_command_takes_the_shared_options():
    commands = dict(_commands(get_command(app)))
    assert {"ingest", "search", "suggest", "serve", "backfill", "queue list"} <= set(commands)
    missing = {name: SHARED_OPTIONS - {opt for p in command.params for opt in p.opts}
               for name, command in commands.items()}
    assert {name: opts for name, opts in missing.items() if opts} == {}


def run(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def team_taxonomy(tmp_path):
    raw = yaml.safe_load((DATA_DIR / "taxonomy.yaml").read_text())
    raw["name"] = "team-tax"
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_taxonomy_option_before_or_after_the_command(team_taxonomy):
    before = json.loads(run("--taxonomy", team_taxonomy, "taxonomy", "--json"))
    after = json.loads(run("taxonomy", "--json", "--taxonomy", team_taxonomy))
    assert before["name"] == after["name"] == "team-tax"
    assert json.loads(run("taxonomy", "--json"))["name"] != "team-tax"


@pytest.fixture
def hashing_config(tmp_path):
    """A settings file choosing the hashing embedder, so the commands run without the model."""
    path = tmp_path / "pmkb.yaml"
    path.write_text("embedder: hashing\n")
    return path


def test_kb_and_config_before_or_after_ingest_and_search(tmp_path, hashing_config):
    total = sum(1 for line in LABELLED.read_text().splitlines() if line.strip())
    after = json.loads(run("ingest", LABELLED, "--json", "--kb", tmp_path / "a", "--config", hashing_config))
    before = json.loads(run("--kb", tmp_path / "b", "--config", hashing_config, "ingest", LABELLED, "--json"))
    assert after["added"] == before["added"] == total
    assert after["kb"].startswith(str(tmp_path / "a")) and before["kb"].startswith(str(tmp_path / "b"))
    hits = json.loads(run("search", "GPU has fallen off the bus", "--json", "-k", "3",
                          "--kb", tmp_path / "a", "--config", hashing_config))
    assert len(hits) == 3 and {h["id"] for h in hits} <= {json.loads(line)["id"] for line in LABELLED.open()}


def test_the_option_after_the_command_wins(tmp_path, hashing_config):
    report = json.loads(run("--kb", tmp_path / "outer", "--config", hashing_config,
                            "ingest", LABELLED, "--json", "--kb", tmp_path / "inner"))
    assert report["kb"].startswith(str(tmp_path / "inner")) and not (tmp_path / "outer").exists()
