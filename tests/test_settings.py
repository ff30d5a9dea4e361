"""The settings and tuning records: the documentation tables name every field with its default, users get at
most six settings, and every form of a value (Python, `TINN_SETTINGS` text) is checked or fails naming the field."""
import dataclasses
import re

import pytest

import tinn
from tinn import settings
from tinn.settings import Settings, Tuning


def _table_rows(heading: str) -> dict:
    """{field: default} of the table under `heading` in tinn/settings.py's docstring."""
    rows, inside = {}, False
    for line in settings.__doc__.splitlines():
        if line.startswith("`"):
            inside = line.startswith(heading)
        m = re.match(r"\| (\w+) \| ([^|]+) \|", line)
        if inside and m and m.group(1) != "field":
            rows[m.group(1)] = m.group(2).strip()
    return rows


@pytest.mark.parametrize("record", [Settings, Tuning])
def test_every_field_is_documented_with_its_default(record):
    rows = _table_rows(f"`{record.__name__}`")
    for field in dataclasses.fields(record):
        assert field.name in rows, f"{record.__name__}.{field.name} is missing from the table in tinn/settings.py"
        default = field.default
        shown = rows[field.name].strip('"')
        if isinstance(default, str):
            assert shown == default, field.name
        elif field.name == "table_chunk_elements":
            assert shown == "2^30" and default == 1 << 30
        else:
            assert shown == str(default), field.name
    assert set(rows) == {f.name for f in dataclasses.fields(record)}


def test_users_choose_from_at_most_six_settings_and_the_kernel_knobs_are_apart():
    names = {f.name for f in dataclasses.fields(Settings)}
    assert len(names) <= 6
    assert not any(name.startswith("fused_") for name in names)
    assert not names & {f.name for f in dataclasses.fields(Tuning)}
    assert "Settings" in tinn.__all__ and "Tuning" not in tinn.__all__


def test_a_field_given_to_the_other_record_says_where_it_belongs():
    with pytest.raises(tinn.ConfigError, match=r"'fused_tile' is a field of tinn.Tuning.*tinn.init\(tuning="):
        Settings().replace(fused_tile=32)
    with pytest.raises(tinn.ConfigError, match=r"'deterministic' is a field of tinn.Settings.*tinn.init\(settings="):
        settings.build(None, tuning={"deterministic": True})
    with pytest.raises(tinn.ConfigError, match=r"unknown settings field 'kernel'.*did you mean 'kernels'"):
        settings.build(None, {"kernel": "fused"})


def test_text_form_parses_typed_values_of_both_records_and_names_bad_fields():
    parsed = settings.parse("autograd_calling_thread=false, fused_tile=32,fused_loss=none")
    assert parsed == {"autograd_calling_thread": False, "fused_tile": 32, "fused_loss": None}
    chosen = settings.build(None).replace(**parsed)
    assert chosen.settings.autograd_calling_thread is False and chosen.tuning.fused_tile == 32
    with pytest.raises(tinn.ConfigError, match="unknown setting 'autograd_caling_thread'.*autograd_calling_thread"):
        settings.parse("autograd_caling_thread=false")
    with pytest.raises(tinn.ConfigError, match="autograd_calling_thread"):
        Settings().replace(autograd_calling_thread=3)


# Wrong values per field type: Python values for the records / `tinn.init(settings=..., tuning=...)`, text for
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


@pytest.mark.parametrize("record, argument", [(Settings, "settings"), (Tuning, "tuning")])
def test_every_field_rejects_wrong_types_and_ranges_everywhere(record, argument):
    fields = dataclasses.fields(record)
    assert {f.type for f in fields} <= set(_WRONG_VALUES), "a field of a new type needs wrong values here"
    for field in fields:
        for value in _WRONG_VALUES[field.type]:
            pattern = rf"{argument}\.{field.name}="
            with pytest.raises(tinn.ConfigError, match=pattern):
                record(**{field.name: value})
            with pytest.raises(tinn.ConfigError, match=pattern):
                record().replace(**{field.name: value})
            with pytest.raises(tinn.ConfigError, match=pattern):
                settings.build(None, **{argument: {field.name: value}})
            # tinn is initialised by conftest; the override is still checked before it is compared.
            with pytest.raises(tinn.ConfigError, match=pattern):
                tinn.init(**{argument: {field.name: value}})
        for text in _WRONG_TEXT[field.type]:
            with pytest.raises(tinn.ConfigError, match=rf"TINN_SETTINGS: ({argument}\.)?{field.name}="):
                settings.build(f"{field.name}={text}")


def test_errors_name_the_allowed_values():
    with pytest.raises(tinn.ConfigError, match=r"fast_launch=None must be true or false"):
        Tuning(fast_launch=None)
    with pytest.raises(tinn.ConfigError, match=r"vendor_weight_gradients=None must be true or false"):
        tinn.init(tuning={"vendor_weight_gradients": None})
    with pytest.raises(tinn.ConfigError, match=r"fast_launch='no' must be true or false"):
        Tuning(fast_launch="no")
    with pytest.raises(tinn.ConfigError, match=r"fused_tile='32' must be an integer, got str"):
        Tuning(fused_tile="32")
    with pytest.raises(tinn.ConfigError, match=r"fused_loss=1 must be true, false or None"):
        Tuning(fused_loss=1)
    with pytest.raises(tinn.ConfigError,
                       match=r"precision='half'.*allowed: \['auto', 'float32', 'tf32', 'float16', 'bfloat16'\]"):
        Settings(precision="half")
    with pytest.raises(tinn.ConfigError, match=r"TINN_SETTINGS: fast_launch='none' must be true or false"):
        settings.parse("fast_launch=none")


def test_right_values_are_accepted_in_every_form():
    chosen = settings.build("fused_loss=auto,fused_tile=32,kernels=unfused", tuning={"fast_launch": False})
    assert (chosen.tuning.fused_loss, chosen.tuning.fused_tile, chosen.settings.kernels, chosen.tuning.fast_launch) \
        == (None, 32, "unfused", False)
    assert Tuning(dense_step_graphs=None, gpu_max_reg=0, fused_backward_tile=48).fused_backward_tile == 48
    # A record replaces its part of the environment's values and keeps the other's.
    chosen = settings.build("deterministic=true,fused_tile=32", Settings(precision="float16"))
    assert chosen.settings == Settings(precision="float16") and chosen.tuning.fused_tile == 32
    with pytest.raises(tinn.ConfigError, match="tuning must be a tinn.Tuning or a dict"):
        settings.build(None, tuning=Settings())
