"""config/marshal-workers.toml documents every setting with its true default."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from marshal_workers.core.config import SETTINGS, Settings, load_settings

CONFIG_FILE = Path(__file__).resolve().parents[3] / "config" / "marshal-workers.toml"


def test_the_shipped_config_file_loads_to_the_defaults() -> None:
    loaded = load_settings(str(CONFIG_FILE), env={})
    assert loaded == Settings(client_id=loaded.client_id)


def test_the_shipped_config_file_mentions_every_setting_with_an_explanation() -> None:
    text = CONFIG_FILE.read_text()
    for name in SETTINGS:
        match = re.search(rf"^((?:# .*\n)+)#? ?{name} = ", text, re.MULTILINE)
        assert match, f"{name} is missing from {CONFIG_FILE.name} or has no comment above it"


def test_the_values_written_in_the_config_file_are_the_defaults() -> None:
    written = tomllib.loads(CONFIG_FILE.read_text())
    defaults = Settings()
    for name, value in written.items():
        if name == "kafka":
            continue
        expected = getattr(defaults, name)
        actual = SETTINGS[name].parse(value) if isinstance(expected, float) else value
        assert actual == expected, name
