"""Drafter weights load only from safetensors or a plain tensor pickle; a pickle that would run code is refused."""
from __future__ import annotations

import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from specviz.models.loader import ModelError
from specviz.models.weights import load_state_dict


class Exploit:
    """Unpickling this would run a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("protocol, needle", [(2, "refused: the file holds pickled code; use safetensors"),
                                               (pickle.HIGHEST_PROTOCOL, "refused: .*use safetensors")])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, protocol, needle):
    marker = tmp_path / "pwned"
    bad = tmp_path / "drafter.pt"
    with open(bad, "wb") as f:
        pickle.dump({"weight": Exploit(marker)}, f, protocol=protocol)
    with pytest.raises(ModelError, match=needle) as info:
        load_state_dict(bad)
    assert "\n" not in str(info.value) and str(tmp_path) not in str(info.value)
    assert not marker.exists()  # the payload never ran
    # the check can fail: the unrestricted unpickler does run it
    pickle.load(open(bad, "rb"))
    assert marker.exists()


def test_safetensors_and_plain_tensor_pickles_load(tmp_path):
    state = {"head.weight": torch.randn(4, 3), "head.bias": torch.zeros(4)}
    save_file(state, tmp_path / "drafter.safetensors")
    torch.save(state, tmp_path / "drafter.pt")
    for name in ("drafter.safetensors", "drafter.pt"):
        loaded = load_state_dict(tmp_path / name)
        assert loaded.keys() == state.keys()
        assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_unreadable_files_are_one_line_errors(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"garbage")
    (tmp_path / "junk.pt").write_bytes(b"garbage")
    torch.save([1, 2], tmp_path / "list.pt")
    for name, needle in (("junk.safetensors", "not a valid safetensors"), ("junk.pt", "not a plain tensor file"),
                         ("list.pt", "does not hold a state dict"), ("missing.pt", "does not exist")):
        with pytest.raises(ModelError, match=needle):
            load_state_dict(tmp_path / name)
