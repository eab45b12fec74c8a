"""``--shard K/N`` (tests/conftest.py): N round-robin shards of the selected tests, disjoint and together the
whole selection, so that ``scripts/gpu.sh`` can spread a GPU suite longer than one device call over N calls."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _collected(*args) -> list:
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args,
                          os.path.join(HERE, "test_formats.py")], capture_output=True, text=True, cwd=HERE)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_shards_split_the_selection():
    whole = _collected()
    shards = [_collected("--shard", f"{k}/3") for k in (1, 2, 3)]
    assert len(whole) >= 3 and all(shards)
    assert sorted(sum(shards, [])) == sorted(whole)  # disjoint, and together the whole selection
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # round robin: sizes within one


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_malformed_shard_is_refused(bad):
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--shard", bad,
                          os.path.join(HERE, "test_formats.py")], capture_output=True, text=True, cwd=HERE)
    assert out.returncode != 0 and "--shard: expected K/N" in out.stderr, out.stdout + out.stderr
