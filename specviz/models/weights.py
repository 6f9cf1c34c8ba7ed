"""Load a drafter's weights without running code: safetensors, or torch.load(weights_only=True).

A pickle can run arbitrary code when it is unpickled; a `.pt`/`.bin` file from an untrusted source is
therefore read with PyTorch's restricted unpickler, which only rebuilds tensors and plain containers,
and a file that asks for anything else is refused with a one-line ModelError.
"""
from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch

from specviz.models.loader import ModelError

SAFETENSORS_SUFFIXES = (".safetensors",)


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A name -> tensor dict from a .safetensors file, or a plain tensor .pt/.bin file (never running code)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"weights file {path.name!r} does not exist")
    if path.suffix in SAFETENSORS_SUFFIXES:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelError(f"weights file {path.name!r} is not a valid safetensors file "
                             f"({type(exc).__name__})") from None
    try:
        with warnings.catch_warnings():  # "pickle protocol 4 ... might not support": we refuse those anyway
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" in str(exc).lower():  # the pickle names a function or class to call: code
            raise ModelError(f"weights file {path.name!r} refused: the file holds pickled code; "
                             "use safetensors") from None
        raise ModelError(f"weights file {path.name!r} refused: it is not a plain tensor file (a pickle that may "
                         "hold code, or a damaged file); use safetensors") from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise ModelError(f"weights file {path.name!r} could not be read ({type(exc).__name__}): "
                         "save it with safetensors or torch.save(state_dict)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ModelError(f"weights file {path.name!r} does not hold a state dict (names -> tensors)")
    return state
