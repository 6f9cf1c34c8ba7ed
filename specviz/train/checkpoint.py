"""Reading a training checkpoint (train/loop.py's Run.save) as tensors and plain values only, never code."""
from __future__ import annotations

from pathlib import Path

import torch

from specviz.drafters.config import DrafterError

CHECKPOINT_KEYS = ("module", "optim", "schedule", "step", "seconds", "rng", "best")


def read_checkpoint(path: Path) -> dict:
    """A training checkpoint (Run.save) loaded with torch.load(weights_only=True): tensors, numbers, strings and
    containers only; a file holding anything else (pickled code) or missing a part is refused in one line."""
    import pickle

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise DrafterError(f"checkpoint {str(path)!r} refused: it holds more than tensors and plain values (pickled "
                           "code?); delete it, or drop --resume") from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise DrafterError(f"checkpoint {str(path)!r} cannot be read ({type(exc).__name__}): delete it, or drop "
                           "--resume") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in CHECKPOINT_KEYS):
        raise DrafterError(f"checkpoint {str(path)!r} is not one `train` wrote (it needs {', '.join(CHECKPOINT_KEYS)})"
                           ": delete it, or drop --resume")
    return ckpt
