"""The Hugging Face Hub, asked once and briefly: whether a repo can be had (the local cache, else one HEAD request of
TIMEOUT_S, no retries), so an offline machine or an unknown repo is one line in seconds (transformers retries for
48 s first). No specviz imports: the pair chooser (hardware) and the loader both ask it."""
from __future__ import annotations

import os
from typing import Iterable, Optional

TIMEOUT_S = 3.0  # one HEAD request per repo, no retries: an offline machine answers within this


def reachable(repo_ids: Iterable[str], timeout: float = TIMEOUT_S) -> bool:
    """True when every repo's config.json resolves: on the Hub (one HEAD request each, no retries) or, offline
    (HF_HUB_OFFLINE=1 or no network), in the local Hub cache. Never raises."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    except ImportError:
        return False
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    for repo_id in repo_ids:
        try:
            if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
                continue
            if offline:
                return False
            get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=timeout)
        except Exception:  # no network, DNS failure, timeout, unknown or gated repo: all mean "not reachable"
            return False
    return True


def fetch(repo_id: str, filename: str, revision: str, timeout: float = TIMEOUT_S) -> str:
    """The path of one file of a repo at a commit: from the local Hub cache (no request), else downloaded once after
    one HEAD request of `timeout` s (no retries, so an offline machine fails within it). Raises where it cannot."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, filename, revision=revision)
    if isinstance(cached, str):
        return cached
    get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), timeout=timeout)
    return hf_hub_download(repo_id, filename, revision=revision, etag_timeout=timeout)


def missing(spec: str, repo_id: str) -> Optional[str]:
    """The one line for a model spec whose Hub repo cannot be had now (reachable), else None."""
    if reachable([repo_id]):
        return None
    return (f"could not load model {spec!r}: {repo_id!r} is not in this machine's Hugging Face cache and the Hub did "
            f"not answer for it within {TIMEOUT_S:g} s (offline, or no such public repo): use smollm2-135m, a local "
            "folder or a .gguf file")
