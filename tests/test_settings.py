"""PLANC_* settings are read in planc/base/settings.py alone, and each is documented."""

import re
from pathlib import Path

import pytest

from planc.base import settings

ROOT = Path(__file__).resolve().parent.parent


def test_no_planc_variable_is_read_outside_settings():
    offenders = []
    for p in (ROOT / "planc").rglob("*.py"):
        if p.name == "settings.py":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"""environ(\.get)?\s*[\[(]\s*["']PLANC_""", line):
                offenders.append(f"{p.relative_to(ROOT)}:{i}")
    assert not offenders, f"read PLANC_* through planc.base.settings: {offenders}"


def test_every_setting_is_documented():
    names = set(re.findall(r'"(PLANC_[A-Z_]+)"', (ROOT / "planc" / "base" / "settings.py").read_text()))
    assert names
    for doc in ("cli.md", "execution.md"):
        text = (ROOT / "docs" / doc).read_text()
        assert not [n for n in names if f"`{n}`" not in text], doc


def test_values(monkeypatch):
    monkeypatch.setenv("PLANC_RAW_LAUNCH", "0")
    monkeypatch.setenv("PLANC_HOST_RESERVE", "1GiB")
    monkeypatch.setenv("PLANC_KERNEL_DIR", "/tmp/k")
    assert not settings.raw_launch() and settings.host_reserve_bytes() == 1 << 30
    assert settings.kernel_dir() == Path("/tmp/k")
    monkeypatch.delenv("PLANC_RAW_LAUNCH")
    monkeypatch.delenv("PLANC_HOST_RESERVE")
    assert settings.raw_launch() and settings.host_reserve_bytes() == settings.DEFAULT_HOST_RESERVE
    monkeypatch.setenv("PLANC_HOST_RESERVE", "lots")
    with pytest.raises(settings.SettingError, match="PLANC_HOST_RESERVE"):
        settings.host_reserve_bytes()
    assert settings.pin() == "register"
    monkeypatch.setenv("PLANC_PIN", "alloc")
    assert settings.pin() == "alloc"
    monkeypatch.setenv("PLANC_PIN", "mlock")
    with pytest.raises(settings.SettingError, match="PLANC_PIN.*register, alloc"):
        settings.pin()


def test_overridden_takes_precedence_and_restores(monkeypatch, tmp_path):
    monkeypatch.setenv("PLANC_KERNEL_DIR", "/tmp/k")
    with settings.overridden({"kernel_dir": tmp_path, "raw_launch": False, "probe": "off"}):
        assert settings.kernel_dir() == tmp_path and not settings.raw_launch() and settings.probe_file() is None
        with settings.overridden({"raw_launch": True}):
            assert settings.raw_launch() and settings.kernel_dir() == tmp_path
        assert not settings.raw_launch()
    assert settings.kernel_dir() == Path("/tmp/k") and settings.raw_launch()
    with pytest.raises(settings.SettingError, match="expected a bool"):
        with settings.overridden({"raw_launch": 1.5}):
            pass
    assert set(settings.NAMES.values()) == set(re.findall(r'"(PLANC_[A-Z_]+)"', (ROOT / "planc" / "base" / "settings.py")
                                                          .read_text()))


def test_a_bad_pin_method_is_refused_before_anything_is_read():
    with pytest.raises(settings.SettingError, match="'pin'.*register, alloc"):
        with settings.overridden({"pin": "mlock"}):
            pass
    with settings.overridden({"pin": "alloc"}):
        assert settings.pin() == "alloc"


def test_the_digest_hasher_is_a_checked_setting(monkeypatch):
    assert settings.digest_hash() == "best"
    for v in settings.DIGEST_HASHES:
        monkeypatch.setenv("PLANC_DIGEST_HASH", v)
        assert settings.digest_hash() == v
    monkeypatch.setenv("PLANC_DIGEST_HASH", "sse9")
    with pytest.raises(settings.SettingError, match="PLANC_DIGEST_HASH: 'sse9' is not one of best, avx512"):
        settings.digest_hash()
    monkeypatch.delenv("PLANC_DIGEST_HASH")
    with pytest.raises(settings.SettingError, match="setting 'digest_hash'"):
        with settings.overridden({"digest_hash": 512}):
            pass
    with settings.overridden({"digest_hash": "scalar"}):
        assert settings.digest_hash() == "scalar"

    with pytest.raises(settings.SettingError, match="'digest_hash'.*'fast' is not one of"):
        settings.Settings(digest_hash="fast")  # a Settings made directly is checked too


def test_the_issue_path_s_lock_is_a_checked_setting(monkeypatch):
    assert settings.issue_gil() == "hold"
    monkeypatch.setenv("PLANC_ISSUE_GIL", "release")
    assert settings.issue_gil() == "release"
    monkeypatch.setenv("PLANC_ISSUE_GIL", "drop")
    with pytest.raises(settings.SettingError, match="PLANC_ISSUE_GIL.*hold, release"):
        settings.issue_gil()
    with pytest.raises(settings.SettingError, match="setting 'issue_gil'"):
        settings.Settings(issue_gil="never")


def test_the_ring_setting_is_checked(monkeypatch):
    assert settings.ring() == "fresh"
    monkeypatch.setenv("PLANC_RING", "kept")
    assert settings.ring() == "kept" and settings.Settings.resolve().ring == "kept"
    monkeypatch.setenv("PLANC_RING", "forever")
    with pytest.raises(settings.SettingError, match="PLANC_RING.*fresh, kept"):
        settings.ring()
