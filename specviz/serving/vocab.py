"""Before `probe` judges a served drafter: does the server speak the vocabulary it is judged against? A server that
runs another model (another tokenizer) gives acceptance figures and greedy answers that mean nothing against the
drafter trained here or against the reference server, and nothing fails loudly (SGLang #23838: a mismatched draft
vocabulary was silently lossy). So probe asks the server to tokenize one fixed sample (vLLM's and llama.cpp's
`/tokenize`) and compares the ids with the expected tokenizer's (probe --local: the target specviz runs; --reference:
the reference server's own answer). A mismatch is one line and probe stops before any judgement; a server without
`/tokenize` is a note, and the served model id is named either way. Torch-free (the expected tokenizer is loaded by
the caller, transformers only).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

from specviz.serving.prometheus import ServerError, Unreachable, base_url, http

# letters, digits, punctuation, a newline and indentation, accents and CJK: tokenizers that differ split it differently
SAMPLE = "Speculative decoding, 2024: the café's naïve drafter\n    def f(x): return x ** 2  # 東京"
TIMEOUT = 10.0


class VocabMismatch(ServerError):
    """The server tokenizes the sample otherwise than the vocabulary it is judged against; str() is one line."""


@dataclass(frozen=True)
class Expected:
    """The vocabulary probe judges against: its name and the ids it gives SAMPLE (no special tokens added)."""
    name: str
    tokens: tuple[int, ...]


def expected_from_tokenizer(name: str, tokenizer) -> Expected:
    return Expected(name, tuple(tokenizer.encode(SAMPLE, add_special_tokens=False)))


def expected_for(spec: str) -> Expected:
    """The expected vocabulary of a model spec (smollm2-135m, a Hub id, a folder): its tokenizer only, no weights."""
    from transformers import AutoTokenizer

    from specviz.models.loader import resolve

    source = resolve(spec)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return expected_from_tokenizer(spec, AutoTokenizer.from_pretrained(source.location, **kwargs))


def served_models(url: str) -> list[str]:
    """The model ids an OpenAI-compatible server lists at /v1/models ([] when it lists none or cannot)."""
    try:
        status, raw = http("GET", base_url(url) + "/v1/models", timeout=TIMEOUT)
        data = json.loads(raw) if status == 200 else {}
    except Unreachable:
        raise
    except (ServerError, ValueError):
        return []
    entries = data.get("data") if isinstance(data, dict) else None
    return [str(e["id"]) for e in entries or [] if isinstance(e, dict) and e.get("id")]


def served_tokens(url: str, text: str = SAMPLE, model: Optional[str] = None) -> Optional[list[int]]:
    """The ids the server gives `text`, special tokens left out: vLLM's POST /tokenize {prompt, add_special_tokens},
    else llama.cpp's {content}; None when the server has no such endpoint."""
    target = base_url(url) + "/tokenize"
    bodies = [{"prompt": text, "add_special_tokens": False, **({"model": model} if model else {})},
              {"content": text, "add_special": False}]
    for body in bodies:
        try:
            status, raw = http("POST", target, timeout=TIMEOUT, json=body)
            data = json.loads(raw) if status == 200 else None
        except Unreachable:
            raise
        except (ServerError, ValueError):
            continue
        tokens = data.get("tokens") if isinstance(data, dict) else None
        # llama.cpp answers vLLM's body too, with no tokens (it reads "content" only): not an answer, try the next
        if isinstance(tokens, list) and (tokens or not text):
            return [t["id"] if isinstance(t, dict) else t for t in tokens]
    return None


def _first_difference(a: list[int], b: list[int]) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"{len(a)} ids, differing from id {i} ({a[i:i + 3]} vs {b[i:i + 3]})"


def check_served(url: str, expect: Optional[Expected] = None, reference: Optional[str] = None,
                 log: Callable[[str], None] = print) -> dict:
    """Compare the server's tokenization of SAMPLE with `expect` and with the reference server's; VocabMismatch (one
    line) on a difference. Returns what was checked, for the report."""
    models = served_models(url)
    named = f"{base_url(url)} (serving {', '.join(repr(m) for m in models[:3])})" if models else base_url(url)
    out = {"models": models, "checked_against": [], "unchecked": None}
    if expect is None and reference is None:
        return out
    tokens = served_tokens(url, SAMPLE, models[0] if models else None)
    if tokens is None:
        out["unchecked"] = f"{named} has no /tokenize: the vocabulary was not checked"
        log(f"note: {out['unchecked']}")
        return out
    if expect is not None:
        if tokens != list(expect.tokens):
            raise VocabMismatch(f"{named} tokenizes the sample otherwise than {expect.name} "
                                f"({_first_difference(tokens, list(expect.tokens))}): it serves another vocabulary, "
                                f"so its figures cannot be judged against {expect.name}; serve {expect.name} or "
                                "compare with the drafter trained for the served model")
        out["checked_against"].append(expect.name)
    if reference is not None:
        ref_models = served_models(reference)
        theirs = served_tokens(reference, SAMPLE, ref_models[0] if ref_models else None)
        if theirs is None:
            log(f"note: the reference {base_url(reference)} has no /tokenize: its vocabulary was not checked")
        elif theirs != tokens:
            raise VocabMismatch(f"{named} and the reference {base_url(reference)}"
                                + (f" (serving {ref_models[0]!r})" if ref_models else "")
                                + f" tokenize the sample differently ({_first_difference(tokens, theirs)}): greedy "
                                  "answers from two vocabularies cannot be compared; serve the same model on both")
        else:
            out["checked_against"].append(base_url(reference))
    return out
