"""The settings record: its documentation table names every field with its default, and the
`TINN_SETTINGS` text form parses into typed values or fails naming the field."""
import dataclasses
import re

import pytest

import tinn
from tinn import settings


def _table_rows() -> dict:
    rows = {}
    for line in settings.__doc__.splitlines():
        m = re.match(r"\| (\w+) \| ([^|]+) \|", line)
        if m and m.group(1) != "field":
            rows[m.group(1)] = m.group(2).strip()
    return rows


def test_every_field_is_documented_with_its_default():
    rows = _table_rows()
    for field in dataclasses.fields(tinn.Settings):
        assert field.name in rows, f"settings.{field.name} is missing from the table in tinn/settings.py"
        default = field.default
        shown = rows[field.name].strip('"')
        if isinstance(default, str):
            assert shown == default, field.name
        elif field.name == "table_chunk_elements":
            assert shown == "2^30" and default == 1 << 30
        else:
            assert shown == str(default), field.name
    assert set(rows) == {f.name for f in dataclasses.fields(tinn.Settings)}


def test_text_form_parses_typed_values_and_names_bad_fields():
    parsed = settings.parse("autograd_calling_thread=false, fused_tile=32,fused_loss=none")
    assert parsed == {"autograd_calling_thread": False, "fused_tile": 32, "fused_loss": None}
    assert tinn.Settings().replace(**parsed).autograd_calling_thread is False
    with pytest.raises(tinn.ConfigError, match="unknown setting 'autograd_caling_thread'.*autograd_calling_thread"):
        settings.parse("autograd_caling_thread=false")
    with pytest.raises(tinn.ConfigError, match="autograd_calling_thread"):
        tinn.Settings().replace(autograd_calling_thread=3)
