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


# Wrong values per field type: Python values for `Settings(...)` / `tinn.init(settings=...)`, text for
# `TINN_SETTINGS`. Each must raise a ConfigError naming the field.
_WRONG_VALUES = {
    "bool": (None, "no", 0, 1, 1.0),
    "bool | None": ("no", "none", 0, 1, 1.0),
    "int": (None, "32", 32.0, True, -1 << 40),
    "str": (None, 3, True, "bogus", "AUTO"),
}
_WRONG_TEXT = {
    "bool": ("maybe", "none", "auto", "2"),
    "bool | None": ("maybe", "2"),
    "int": ("x", "3.5", "", "-1000000000000"),
    "str": ("bogus", ""),
}


def test_every_field_rejects_wrong_types_and_ranges_everywhere():
    fields = dataclasses.fields(tinn.Settings)
    assert {f.type for f in fields} == set(_WRONG_VALUES), "a field of a new type needs wrong values here"
    for field in fields:
        for value in _WRONG_VALUES[field.type]:
            pattern = rf"settings\.{field.name}="
            with pytest.raises(tinn.ConfigError, match=pattern):
                tinn.Settings(**{field.name: value})
            with pytest.raises(tinn.ConfigError, match=pattern):
                tinn.Settings().replace(**{field.name: value})
            with pytest.raises(tinn.ConfigError, match=pattern):
                settings.build(None, {field.name: value})
            # tinn is initialised by conftest; the override is still checked before it is compared.
            with pytest.raises(tinn.ConfigError, match=pattern):
                tinn.init(settings={field.name: value})
        for text in _WRONG_TEXT[field.type]:
            with pytest.raises(tinn.ConfigError, match=rf"TINN_SETTINGS: (settings\.)?{field.name}="):
                settings.build(f"{field.name}={text}", None)


def test_errors_name_the_allowed_values():
    with pytest.raises(tinn.ConfigError, match=r"fast_launch=None must be true or false"):
        tinn.Settings(fast_launch=None)
    with pytest.raises(tinn.ConfigError, match=r"vendor_weight_gradients=None must be true or false"):
        tinn.init(settings={"vendor_weight_gradients": None})
    with pytest.raises(tinn.ConfigError, match=r"fast_launch='no' must be true or false"):
        tinn.Settings(fast_launch="no")
    with pytest.raises(tinn.ConfigError, match=r"fused_tile='32' must be an integer, got str"):
        tinn.Settings(fused_tile="32")
    with pytest.raises(tinn.ConfigError, match=r"fused_loss=1 must be true, false or None"):
        tinn.Settings(fused_loss=1)
    with pytest.raises(tinn.ConfigError,
                       match=r"network_precision='half'.*allowed: \['auto', 'float32', 'tf32', 'float16', 'bfloat16'\]"):
        tinn.Settings(network_precision="half")
    with pytest.raises(tinn.ConfigError, match=r"TINN_SETTINGS: fast_launch='none' must be true or false"):
        settings.parse("fast_launch=none")


def test_right_values_are_accepted_in_every_form():
    chosen = settings.build("fused_loss=auto,fused_tile=32,network_kernels=unfused", {"fast_launch": False})
    assert (chosen.fused_loss, chosen.fused_tile, chosen.network_kernels, chosen.fast_launch) == \
        (None, 32, "unfused", False)
    assert tinn.Settings(dense_step_graphs=None, gpu_max_reg=0, fused_backward_tile=48).fused_backward_tile == 48
