"""A GGUF read once per load, where transformers reads it three times.

transformers (5.x) loads a GGUF checkpoint through gguf-py in three passes, each parsing the whole file again: the
config, the tokenizer and the weights (`load_gguf_checkpoint`, each a new `gguf.GGUFReader`: 2.7 s apiece for the
default target's 49,152-token vocabulary on a Zen 3 core), and while mapping the weights it builds gguf-py's tensor
name map again for each of the model's modules (`get_tensor_name_map`, 9 ms, 397 times for SmolLM2-135M). Within
`once()` both calls return the object the first call made: the same reader (read-only: a memory map) and the same
map, so the same tensors, config and tokenizer, in less time. Both names are looked up on the `gguf` module when
transformers calls them (its imports are inside its functions), so replacing them there for the length of a load is
enough; a version that imports them otherwise simply reads the file three times again.

Only the first start pays any of this: the converted model is kept (loader.converted_dir).
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator

_lock = threading.RLock()  # one GGUF load at a time holds the replacements


@contextlib.contextmanager
def once(reading_gguf: bool = True) -> Iterator[None]:
    """For the length of the block, gguf.GGUFReader and gguf.get_tensor_name_map each build an object once per
    distinct argument; both are restored on exit, error or not. A load that reads no GGUF (reading_gguf False)
    replaces nothing and waits for no other load."""
    try:
        import gguf
    except ImportError:  # transformers says so itself when it needs gguf
        gguf = None
    if gguf is None or not reading_gguf:
        yield
        return
    with _lock:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], object] = {}

        def read(path: os.PathLike[str] | str, mode: str = "r") -> object:
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = reader(path, mode)
            return readers[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = read, functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
