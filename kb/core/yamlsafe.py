"""YAML read without aliases, with a size bound: a data file, a config file or a postmortem's
front matter cannot make the reader expand a few hundred bytes into gigabytes.

``safe_load`` already refuses arbitrary objects; what it allows is the alias (``*name``), which
repeats an anchored node by reference, so nested aliases grow exponentially when the value is
used ("billion laughs"). pmkb's files never need one: an alias is refused with its line.
"""

from __future__ import annotations

import yaml

MAX_YAML_BYTES = 10_000_000
"""Largest YAML text read (the bundled signatures, the biggest data file, are 0.2 MB)."""


class NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not allowed: write the value out", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str):
    """The YAML value of ``text``; raises yaml.YAMLError for aliases, oversized text or bad YAML.

    With libyaml (PyYAML's wheels carry it) the text is read in C: its events are scanned for an
    alias first, then it is loaded by the C safe loader, several times faster than the pure-Python
    one on the bundled files. Without libyaml, ``NoAliasLoader`` does both in Python."""
    if len(text) > MAX_YAML_BYTES:
        raise yaml.YAMLError(f"{len(text):,} characters of YAML: more than the {MAX_YAML_BYTES:,} accepted")
    if not yaml.__with_libyaml__:
        return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not allowed: write the value out", event.start_mark)
    return yaml.load(text, Loader=yaml.CSafeLoader)  # noqa: S506 - libyaml's safe loader
