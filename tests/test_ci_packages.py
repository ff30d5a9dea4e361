"""Tests that need a system package skip without it locally and fail in CI, where a missing package means its
install failed (.ci/run sets TINN_REQUIRE_TEST_PACKAGES=1 and stops when an install fails)."""
import os
import re

import pytest

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_missing_package_skips_locally_and_fails_in_ci(monkeypatch):
    monkeypatch.setattr(conftest, "REQUIRE_TEST_PACKAGES", False)
    with pytest.raises(pytest.skip.Exception, match="libfoo missing"):
        conftest.missing_package("libfoo missing")
    monkeypatch.setattr(conftest, "REQUIRE_TEST_PACKAGES", True)
    with pytest.raises(pytest.fail.Exception, match="libfoo missing; TINN_REQUIRE_TEST_PACKAGES=1"):
        conftest.missing_package("libfoo missing")


def test_ci_requires_its_packages_and_stops_when_an_install_fails():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        script = f.read()
    assert "set -euo pipefail" in script
    assert re.search(r"^export TINN_REQUIRE_TEST_PACKAGES=1$", script, re.M)
    for package in ("mesa-vulkan-drivers", "libvulkan1", "glmark2-data", "assimp-testmodels"):
        assert package in script
    # No install is allowed to fail quietly (`|| echo ...`, `|| true`).
    assert not re.search(r"apt-get (update|install)[^\n]*\|\|", script) and "|| echo" not in script
    assert "|| true" not in script
