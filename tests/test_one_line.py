"""Bad input as a new user meets it gets one line, never a traceback (issue 53): a drafter folder with a corrupt or
ill-typed config.json, drafter weights of the wrong shapes, an unknown device, a lone surrogate in a prompt, lanes
that are not text, a checkpoint that holds code. CLI: exit 2 and one `specviz: error:` line, before the target loads;
app: a named message (ConfigError / ModelError through user_message), the app serving on. No real model loads here."""
from __future__ import annotations

import json
import pickle
import random
import re
import shutil

import pytest
import torch
from tiny import random_drafter, tiny_model

from specviz.cli.main import main
from specviz.config import DecodeConfig, check_prompt
from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterConfig, DrafterError, read_config
from specviz.errors import ConfigError
from specviz.models import loader as models
from specviz.paths import DRAFTERS
from specviz.prompts import PromptFileError
from specviz.prompts import read as read_prompts

SHIPPED_EAGLE = DRAFTERS / "smollm2-135m-eagle"


def one_line_exit_2(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if line.startswith("specviz: error:")]
    assert len(lines) == 1 and "Traceback" not in "\n".join(err), err
    return lines[0]


@pytest.fixture
def drafter_copy(tmp_path):
    """The shipped EAGLE drafter's folder, copied to be damaged."""
    folder = tmp_path / "eagle"
    shutil.copytree(SHIPPED_EAGLE, folder)
    return folder


@pytest.mark.parametrize("text, needle", [
    ('{"kind": "eag', "is not valid JSON (line 1"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"kind": "eagle"}', "lacks target, hidden_size, vocab_size"),
])
def test_a_corrupt_drafter_config_is_one_line_before_the_target_loads(drafter_copy, text, needle, capsys,
                                                                      no_model_loads):
    (drafter_copy / "config.json").write_text(text)
    line = one_line_exit_2(["generate", "--prompt", "hi", "--method", "eagle", "--drafter", str(drafter_copy)], capsys)
    assert needle in line and str(drafter_copy) in line, line


@pytest.mark.parametrize("field, value, needle", [
    ("hidden_size", "576", "hidden_size='576' is not an integer"),
    ("hidden_size", -1, "hidden_size=-1 is out of range"),
    ("input_norm", "yes", "input_norm='yes' is not true or false"),
    ("feature_layers", [2, "x"], "is not a list of layer indices"),
    ("kind", "bogus", "kind='bogus' is unknown"),
    ("num_attention_heads", 7, "do not divide"),
])
def test_ill_typed_config_fields_are_named(drafter_copy, field, value, needle, capsys, no_model_loads):
    raw = json.loads((drafter_copy / "config.json").read_text())
    raw[field] = value
    (drafter_copy / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DrafterError, match="^drafter x: ") as info:
        DrafterConfig.from_dict(read_config(drafter_copy), "drafter x")
    assert needle in str(info.value) and "\n" not in str(info.value)
    line = one_line_exit_2(["check", "--method", "eagle", "--draft", str(drafter_copy)], capsys)
    assert needle in line


def test_a_missing_drafter_folder_is_refused_before_the_target_loads(tmp_path, capsys, no_model_loads):
    line = one_line_exit_2(["generate", "--prompt", "hi", "--method", "medusa", "--drafter",
                            str(tmp_path / "nowhere")], capsys)
    assert "does not exist" in line
    line = one_line_exit_2(["bench", "--prompts", str(tmp_path / "p.txt"), "--json", str(tmp_path / "o.json"),
                            "--method", f"eagle@{tmp_path / 'gone'}"], capsys)
    assert "does not exist" in line
    line = one_line_exit_2(["generate", "--prompt", "hi", "--method", "vanilla", "--draft", "./no/such/model"], capsys)
    assert "does not exist" in line


def test_a_drafter_of_another_kind_is_refused_wherever_a_drafter_is_named(tmp_path, capsys, no_model_loads):
    """`generate --method eagle --drafter MEDUSA_FOLDER` and `bench --method eagle@MEDUSA_FOLDER` ran the Medusa
    drafter labelled eagle, where `check` refused it: the same one line everywhere, before the target loads, and at
    build time for a drafter whose kind is known only once loaded (a Hub id)."""
    from specviz import engines

    medusa = str(DRAFTERS / "smollm2-135m-medusa")
    needle = f"drafter {medusa!r} is a medusa drafter, not eagle: pick method medusa"
    prompts = tmp_path / "p.txt"
    prompts.write_text("Name a colour.\n")
    for argv in (["generate", "--prompt", "hi", "--method", "eagle", "--drafter", medusa],
                 ["bench", "--prompts", str(prompts), "--json", str(tmp_path / "o.json"), "--method",
                  f"eagle@{medusa}"],
                 ["check", "--method", "eagle", "--draft", medusa]):
        assert needle in one_line_exit_2(argv, capsys), argv
    target = tiny_model(0)
    d = random_drafter(target, "medusa", medusa_heads=2)
    drafters.save(tmp_path / "m", d.module, d.cfg, None, "card")
    with pytest.raises(DrafterError, match="is a medusa drafter, not eagle: pick method medusa"):
        engines.build("eagle", target, str(tmp_path / "m"))
    assert engines.build("medusa", target, str(tmp_path / "m")).method == "medusa"

@pytest.mark.parametrize("entry, needle", [
    ("eagle:", "method='eagle:': eagle: names no γ: write eagle:N"),
    ("eagle+pld:", "method='eagle+pld:': +pld: names no size: write +pld:N"),
    ("eagle:2+ret:", "+ret: names no size"),
    ("eagle+pld:2+pld:3", "method='eagle+pld:2+pld:3' names +pld twice: give each branch once"),
    ("medusa+dyn+dyn:4", "names +dyn twice"),
])
def test_a_malformed_bench_entry_is_one_line(entry, needle, tmp_path, capsys, no_model_loads):
    """`eagle:` ran labelled `eagle:+pld:2`, `eagle+pld:` took a default silently and `eagle+pld:2+pld:3` raced
    pld:3 under a label naming both: an empty `:` and a branch given twice are one line naming the entry."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("Name a colour.\n")
    line = one_line_exit_2(["bench", "--prompts", str(prompts), "--json", str(tmp_path / "o.json"), "--method", "pld",
                            entry], capsys)
    assert needle in line, line

@pytest.mark.parametrize("device", ["tpu", "cuda:x", "CPU ", "mps"])
def test_an_unknown_device_is_one_line(device, capsys, no_model_loads):
    line = one_line_exit_2(["generate", "--prompt", "hi", "--method", "ar", "--device", device], capsys)
    assert f"device={device!r}" in line and "use cpu" in line, line


def test_parse_device_takes_what_torch_can_run():
    assert models.parse_device("cpu") == torch.device("cpu")
    assert models.parse_device(None) == models.default_device()
    if not torch.cuda.is_available():
        with pytest.raises(models.ModelError, match="is not available here"):
            models.parse_device("cuda")


def test_drafter_weights_of_the_wrong_shapes_are_one_line(tmp_path):
    target = tiny_model(0)
    d = random_drafter(target, "eagle")
    drafters.save(tmp_path, d.module, d.cfg, None, "card")
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["intermediate_size"] *= 2  # the config now builds a wider MLP than the weights hold
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DrafterError) as info:
        drafters.load(tmp_path, target)
    message = str(info.value)
    assert "\n" not in message and "do not fit its config.json" in message and "mlp" in message, message


def test_vocab_ids_outside_the_vocabulary_are_one_line(tmp_path):
    target = tiny_model(0)
    d = random_drafter(target, "medusa", medusa_heads=2)
    drafters.save(tmp_path, d.module, d.cfg, torch.tensor([1, 2, 999]), "card")
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["draft_vocab"] = 3
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DrafterError, match="vocab_ids reach 999, outside the target's vocabulary of 64"):
        drafters.load(tmp_path, target)


def test_a_well_formed_drafter_still_loads(tmp_path):
    target = tiny_model(0)
    d = random_drafter(target, "eagle")
    drafters.save(tmp_path, d.module, d.cfg, None, "card")
    assert drafters.load(tmp_path, target).kind == "eagle"


LONE = "why\ud83d?"  # half of an emoji's surrogate pair, as a JSON escape or a script can send it


def test_a_lone_surrogate_is_one_line_everywhere(tmp_path, capsys, no_model_loads):
    with pytest.raises(ConfigError, match=r"lone surrogate U\+D83D at character 3"):
        check_prompt(LONE)
    line = one_line_exit_2(["generate", "--prompt", LONE, "--method", "ar"], capsys)
    assert "lone surrogate" in line
    file = tmp_path / "p.jsonl"
    file.write_text('{"prompt": "ok"}\n{"prompt": "half \\ud83d here"}\n')
    with pytest.raises(PromptFileError, match=r"p.jsonl:2 holds a lone surrogate U\+D83D"):
        read_prompts(file)
    line = one_line_exit_2(["bench", "--prompts", str(file), "--json", str(tmp_path / "o.json"), "--method", "pld",
                            "--target", "smollm2-135m"], capsys)
    assert "lone surrogate" in line


@pytest.mark.parametrize("prompt, needle", [(5, "prompt=5 is not text"), (["hi"], "prompt=['hi'] is not text"),
                                            (None, "prompt is empty"), ("  ", "prompt is empty")])
def test_a_prompt_that_is_not_text_is_named(prompt, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        check_prompt(prompt)


def test_the_app_names_a_lone_surrogate_before_loading(no_model_loads):
    from specviz.engines.session import prepare
    from specviz.ui.logic import user_message

    with pytest.raises(ConfigError) as info:
        prepare(LONE, DecodeConfig(method="pld"), "smollm2-135m", None)
    assert "lone surrogate" in user_message(info.value)


@pytest.mark.parametrize("lanes", [123, 1.5, ["pld"], {"a": 1}])
def test_race_many_names_lanes_that_are_not_text(lanes, no_model_loads):
    import gradio as gr

    from specviz.ui.many import many_api

    with pytest.raises(gr.Error) as info:
        many_api("hi", lanes)
    assert f"lanes={lanes!r} is not text" in info.value.message, info.value.message


def checkpoint_like_train_writes(path):
    """What Run.save writes, with a real optimizer, schedule and random state."""
    module = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module(torch.ones(1, 3)).sum().backward()
    optim.step()
    schedule = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0)
    torch.save({"module": module.state_dict(), "optim": optim.state_dict(), "schedule": schedule.state_dict(),
                "step": 3, "seconds": 1.5, "rng": random.Random(0).getstate(),
                "best": (0.5, {k: v.clone() for k, v in module.state_dict().items()})}, path)


class Payload:
    def __reduce__(self):
        return (print, ("this ran",))


def test_resume_reads_a_checkpoint_as_weights_only(tmp_path, capsys):
    from specviz.train.checkpoint import read_checkpoint

    good = tmp_path / "checkpoint.pt"
    checkpoint_like_train_writes(good)
    ckpt = read_checkpoint(good)
    assert ckpt["step"] == 3 and random.Random().setstate(ckpt["rng"]) is None
    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as f:
        pickle.dump({"module": Payload()}, f)
    with pytest.raises(DrafterError, match="refused: it holds more than tensors"):
        read_checkpoint(evil)
    assert "this ran" not in capsys.readouterr().out
    torch.save({"module": {}}, tmp_path / "part.pt")
    with pytest.raises(DrafterError, match="is not one `train` wrote"):
        read_checkpoint(tmp_path / "part.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(DrafterError, match="cannot be read|refused"):
        read_checkpoint(tmp_path / "junk.pt")


@pytest.mark.parametrize("damage, needle", [
    (lambda f: (f / "config.json").write_text('{"kind": "eag'), "is not valid JSON"),
    (lambda f: (f / "config.json").write_text(json.dumps({**json.loads((f / "config.json").read_text()),
                                                          "intermediate_size": 128})), "do not fit its config.json"),
])
def test_the_app_names_a_broken_drafter_folder(tmp_path, damage, needle):
    """What the race tab's prepare() meets (a drafter folder named outside public mode): a named one-line message
    through user_message, where it said 'run failed while loading the models (JSONDecodeError)'."""
    from specviz.engines.session import prepare
    from specviz.ui.logic import user_message

    target = tiny_model(0)
    d = random_drafter(target, "eagle")
    drafters.save(tmp_path, d.module, d.cfg, None, "card")
    damage(tmp_path)
    with pytest.raises(models.ModelError) as info:
        prepare("1 2 3", DecodeConfig(method="eagle", gamma=2), target, str(tmp_path))
    message = user_message(info.value)
    assert needle in message and "\n" not in message and "internal error" not in message, message
