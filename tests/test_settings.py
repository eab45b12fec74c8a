"""The settings module: every W4A16_MOE_* variable typed, documented and read in one place."""

from __future__ import annotations

import pathlib
import re

import pytest

from w4a16_moe import settings

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_docs_table_is_current():
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert settings.markdown_table() in doc, "docs/settings.md is stale: python -m w4a16_moe.settings > docs/settings.md"


def test_every_variable_in_the_tree_is_a_setting():
    """No W4A16_MOE_* name anywhere in the sources that the settings module does not define."""
    known = {s.env for s in settings.SETTINGS}
    seen = set()
    for base in ("python", "scripts", "aot", "csrc", "CMakeLists.txt", ".ci"):
        root = ROOT / base
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and p.suffix != ".json"]
        for p in files:
            try:
                text = p.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            seen |= set(re.findall(r"W4A16_MOE_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])", text))
    assert seen - known == set(), f"undocumented variables: {sorted(seen - known)}"


def test_environment_is_read_only_in_the_settings_module():
    """os.environ lookups of W4A16_MOE_* variables happen in settings.py alone (build scripts aside)."""
    pat = re.compile(r"(environ(\.get)?\s*[\[(]|getenv\s*\()\s*[\"']W4A16_MOE_")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "python").rglob("*.py")
                 if p.name != "settings.py" and pat.search(p.read_text())]
    assert offenders == []


@pytest.mark.parametrize("raw,want", [("1", True), ("true", True), ("ON", True), ("0", False), ("off", False),
                                      ("", False), (None, False)])
def test_bool_parsing(raw, want):
    s = next(s for s in settings.SETTINGS if s.env == "W4A16_MOE_BATCH_INVARIANT")
    assert s.parse(raw) is want


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "maybe")
    with pytest.raises(ValueError, match="W4A16_MOE_BATCH_INVARIANT: expected one of"):
        settings.get()
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT")
    monkeypatch.setenv("W4A16_MOE_BACKEND", "cuda")
    with pytest.raises(ValueError, match="W4A16_MOE_BACKEND: expected one of auto, cute, triton, reference"):
        settings.get()


def test_monkeypatch_refreshes(monkeypatch):
    assert settings.get().cute_decode == "auto"
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    assert settings.get().cute_decode == "0"
    monkeypatch.delenv("W4A16_MOE_CUTE_DECODE")
    assert settings.get().cute_decode == "auto"


def test_override_is_scoped():
    before = settings.get().batch_invariant
    with settings.override(batch_invariant=not before) as s:
        assert s.batch_invariant is (not before) and settings.get().batch_invariant is (not before)
    assert settings.get().batch_invariant is before
    with pytest.raises(TypeError, match="unknown settings"):
        with settings.override(no_such_thing=1):
            pass


def test_cute_family_names_come_from_the_registry(monkeypatch):
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute.provider import family_for

    monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", "hopper")
    info = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
    with pytest.raises(ValueError, match="W4A16_MOE_CUTE_FAMILY: expected auto or one of sm90, warp, got 'hopper'"):
        family_for(info)
