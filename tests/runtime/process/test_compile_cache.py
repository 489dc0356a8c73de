"""Which compile-cache directory a process uses (tianjax.runtime.process.compile_cache)."""

import os

import pytest

from tianjax.runtime.process import compile_cache as cc


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(cc.ENV, raising=False)


def test_key_then_variable_then_default(no_env, monkeypatch, tmp_path):
    assert cc.resolve(None) is None  # the user's own process: opt-in
    assert cc.resolve(None, default=str(tmp_path / "d")) == str(tmp_path / "d")  # an actor
    monkeypatch.setenv(cc.ENV, str(tmp_path / "v"))
    assert cc.resolve(None, default=str(tmp_path / "d")) == str(tmp_path / "v")
    assert cc.resolve(str(tmp_path / "k"), default=str(tmp_path / "d")) == str(tmp_path / "k")


def test_off_turns_it_off_even_where_a_default_applies(no_env, monkeypatch):
    assert cc.resolve(False, default="~/x") is None  # compile_cache: false
    assert cc.resolve("off", default="~/x") is None
    assert cc.resolve("OFF") is None
    monkeypatch.setenv(cc.ENV, "off")
    assert cc.resolve(None, default="~/x") is None
    assert cc.resolve(True) == os.path.expanduser(cc.DEFAULT)  # compile_cache: true, the key wins


def test_home_is_expanded(no_env):
    assert cc.resolve("~/c") == os.path.join(os.path.expanduser("~"), "c")
    assert cc.DEFAULT.endswith(os.path.join("tianjax", "xla"))
