"""What a new user's test found (issue: output paths, prompt-file categories, training and tree data, --resume): each
bad value is one `specviz: error:` line naming it, exit 2, before any model loads or any long work, nothing written.
No real model loads here."""
from __future__ import annotations

import gzip
import json

import pytest
from test_one_line import one_line_exit_2

from specviz.cli.common import InputError, writable_path
from specviz.cli.main import main
from specviz.core import answers
from specviz.paths import DRAFTERS
from specviz.prompts import PromptFileError, pick
from specviz.prompts import read as read_prompts
from specviz.train import distill


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Say hi.", "category": "a"}\n')
    return str(path)


# -- 1. output paths ----------------------------------------------------------------------------------------------

def bad_file_outputs(tmp_path):
    """(path, what the line says) for file outputs that cannot be written."""
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "adir").mkdir()
    return [(str(tmp_path / "afile" / "x.json"), "is a file, not a folder"),
            ("/proc/x.json", "cannot be written (No such file or directory)"),
            (str(tmp_path / "adir"), "is a folder")]


FILE_COMMANDS = {  # a command line with its output file left as {}
    "bench --json": ["bench", "--prompts", "P", "--method", "pld:2", "--json", "{}", "--limit", "1",
                     "--max-new-tokens", "4", "--no-ar-reference"],
    "check --json": ["check", "--method", "pld", "--json", "{}"],
    "check --report": ["check", "--method", "pld", "--report", "{}"],
    "profile --json": ["profile", "--no-drafters", "--json", "{}"],
    "watch --json": ["watch", "http://127.0.0.1:9", "--duration", "0.1", "--json", "{}"],
    "probe --html": ["probe", "http://127.0.0.1:9", "--prompts", "P", "--html", "{}"],
    "serve --log": ["serve", "--engine", "llama.cpp", "--drafter", "ngram", "--log", "{}"],
}


@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_an_unwritable_output_file_is_one_line_before_any_work(command, tmp_path, prompts, capsys, no_model_loads):
    for path, needle in bad_file_outputs(tmp_path):
        argv = [path if a == "{}" else prompts if a == "P" else a for a in FILE_COMMANDS[command]]
        line = one_line_exit_2(argv, capsys)
        flag = command.split("--")[1]
        assert f"{flag}={path!r}" in line and needle in line, line
    assert (tmp_path / "afile").read_text() == "keep me" and not any((tmp_path / "adir").iterdir())


FOLDER_COMMANDS = {
    "train --out": ["train", "eagle", "--steps", "1", "--out", "{}"],
    "distill --out": ["distill", "--prompts", "P", "--out", "{}"],
    "export --out": ["export", "eagle", "--out", "{}"],
}


@pytest.mark.parametrize("command", FOLDER_COMMANDS)
def test_an_unusable_output_folder_is_one_line_before_any_work(command, tmp_path, prompts, capsys, no_model_loads):
    (tmp_path / "afile").write_text("keep me")
    for path, needle in [(str(tmp_path / "afile"), "is a file, not a folder"),
                         (str(tmp_path / "afile" / "sub"), "is a file, not a folder"),
                         ("/proc/specviz-out", "cannot be written (No such file or directory)")]:
        argv = [path if a == "{}" else prompts if a == "P" else a for a in FOLDER_COMMANDS[command]]
        line = one_line_exit_2(argv, capsys)
        assert f"out={path!r}" in line and needle in line, line
    assert (tmp_path / "afile").read_text() == "keep me"


def test_export_never_replaces_a_folder_that_is_not_an_export(tmp_path, capsys, no_model_loads):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    line = one_line_exit_2(["export", "eagle", "--out", str(mine)], capsys)
    assert f"out={str(mine)!r}" in line and "export.json" in line, line
    assert (mine / "notes.txt").read_text() == "keep me"


def test_export_never_replaces_another_sources_export(tmp_path, capsys, no_model_loads, monkeypatch):
    """A new user's pass: `export DRAFTER --out out/export/smollm2-135m` (the target's export) replaced the target's
    weights with the drafter's files, exit 0; an export now replaces only an earlier export of its own source."""
    from specviz.serving.engine_export import ExportError, check_out

    target = tmp_path / "target"
    target.mkdir()
    (target / "export.json").write_text(json.dumps({"kind": "target", "source": "smollm2-135m"}))
    (target / "target-f32.gguf").write_text("weights")
    line = one_line_exit_2(["export", "eagle", "--out", str(target)], capsys)
    assert f"out={str(target)!r}" in line and "holds the export of 'smollm2-135m'" in line, line
    assert (target / "target-f32.gguf").read_text() == "weights"
    check_out(target, "smollm2-135m")  # the target's own export again: may replace it
    with pytest.raises(ExportError, match="holds the export of 'smollm2-135m', not of 'other.gguf'"):
        check_out(target, "other.gguf")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "drafter").mkdir(parents=True)
    drafted = tmp_path / "drafted"
    drafted.mkdir()
    (drafted / "export.json").write_text(json.dumps({"kind": "eagle", "source": "mine/drafter"}))
    check_out(drafted, str(tmp_path / "mine" / "drafter"))  # the same folder, written another way
    with pytest.raises(ExportError, match="not of 'theirs/drafter'"):
        check_out(drafted, "theirs/drafter")
    (drafted / "export.json").write_text("{broken")
    with pytest.raises(ExportError, match="names no source, not of 'mine/drafter'"):
        check_out(drafted, "mine/drafter")


def test_check_names_what_is_wrong_with_a_drafter_path(tmp_path, capsys, no_model_loads):
    """A new user's pass: `check --draft OUT/drafter/model.safetensors` said the file 'does not exist', `check --draft
    OUT` (train's --out) gave no hint of OUT/drafter, and `check --drafter` (as serve, probe and bench spell it) was
    an unrecognized argument."""
    run = tmp_path / "run"
    (run / "drafter").mkdir(parents=True)
    (run / "drafter" / "config.json").write_text("{}")
    (run / "drafter" / "model.safetensors").write_text("weights")
    for flag, path, needle in [("--draft", run / "drafter" / "model.safetensors",
                                f"is a file: give the folder that holds it ({str(run / 'drafter')!r})"),
                               ("--drafter", run, f"its drafter/ has: give {str(run / 'drafter')!r}"),
                               ("--drafter", tmp_path / "nope", "does not exist: give a folder written by python -m "
                                                                "specviz train eagle")]:
        line = one_line_exit_2(["check", "--method", "eagle", flag, str(path)], capsys)
        assert repr(str(path)) in line and needle in line, line


@pytest.mark.parametrize("argv, says", [
    (["check", "--method", "egale"], "argument --method: invalid choice: 'egale' (choose from 'vanilla', 'pld'"),
    (["check", "--limit", "four"], "argument --limit: invalid int value: 'four' (see python -m specviz check --help)"),
    (["serve", "--engine", "vllm", "--drafters", "x"], "the following arguments are required: --drafter"),
    (["tran"], "argument command: invalid choice: 'tran'"),
])
def test_argparse_errors_are_one_line_too(argv, says, capsys):
    """A new user's pass: a typo'd method or a word for a number printed argparse's ten-line usage block before its
    error; every bad value is one line."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("specviz: error: ") and says in err[0], err


def test_a_writable_output_path_passes_and_nothing_is_created_or_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text("old")
    assert writable_path("json", "old.json").name == "old.json"
    assert writable_path("json", str(tmp_path / "new" / "deeper" / "x.json")).name == "x.json"
    assert writable_path("out", str(tmp_path / "new-folder"), folder=True).name == "new-folder"
    assert writable_path("out", str(tmp_path), folder=True) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"] and (tmp_path / "old.json").read_text() == "old"
    with pytest.raises(InputError, match=r"^json=.* is a folder: give the path of a file to write$"):
        writable_path("json", str(tmp_path))


# -- 2. prompt-file categories ------------------------------------------------------------------------------------

def test_a_number_category_is_read_as_its_text(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi", "category": 5}\n{"prompt": "yo", "category": "y"}\n'
                    '{"prompt": "so", "category": 2.5}\n')
    rows = read_prompts(path)
    assert [r["category"] for r in rows] == ["5", "y", "2.5"]
    assert [r["prompt"] for r in pick(rows, ["5"])] == ["hi"]
    assert [r["prompt"] for r in pick(rows, ["y"])] == ["yo"]
    with pytest.raises(PromptFileError, match=r"categories \['z'\] are not in the prompt file: use some of 2.5, 5, y"):
        pick(rows, ["z"])


@pytest.mark.parametrize("value", [["a"], {"a": 1}, True])
def test_a_category_that_is_not_text_is_one_line_naming_file_line_and_value(tmp_path, value):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + json.dumps({"prompt": "hi", "category": value}) + "\n")
    with pytest.raises(PromptFileError) as info:
        read_prompts(path)
    message = str(info.value)
    assert f"{path}:2" in message and repr(value) in message and "\n" not in message, message


def test_bench_with_a_number_category_runs_past_the_prompt_file(tmp_path, capsys, no_model_loads):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi", "category": 5}\n{"prompt": "yo", "category": "y"}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "category": ["a"]}\n')
    with pytest.raises(AssertionError, match="a model was loaded"):  # the file was read and picked: on to the target
        main(["bench", "--prompts", str(path), "--categories", "5", "--method", "pld", "--json",
              str(tmp_path / "out.json")])
    line = one_line_exit_2(["bench", "--prompts", str(bad), "--method", "pld", "--json", str(tmp_path / "o.json")],
                           capsys)
    assert f"{bad}:1" in line and "['a']" in line, line


# -- 3. train --data that holds no usable prompts ------------------------------------------------------------------

def bad_data(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    no_prompt = tmp_path / "no-prompt.jsonl"
    no_prompt.write_text('{"question": "hi"}\n')
    corrupt = tmp_path / "corrupt.jsonl.gz"
    corrupt.write_bytes(gzip.compress(b'{"prompt": "hi"}\n' * 50)[:40])
    return [(empty, "holds no prompts"), (no_prompt, "has no 'prompt' text"), (corrupt, "cannot be read")]


def test_train_data_without_prompts_is_one_line_before_the_target_loads(tmp_path, capsys, no_model_loads):
    for path, needle in bad_data(tmp_path):
        line = one_line_exit_2(["train", "eagle", "--out", str(tmp_path / "t"), "--steps", "1", "--data", str(path)],
                               capsys)
        assert str(path) in line and needle in line, line


def test_train_on_fewer_prompts_than_one_held_out_is_one_line_before_the_target_loads(tmp_path, capsys,
                                                                                     no_model_loads):
    """A new user's smoke run on 8 prompts answered them for 2 minutes, then a traceback (`max()` of an empty
    held-out split): every 20th answer is held out, so fewer than 20 prompts now stop before the target loads."""
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(8)))
    line = one_line_exit_2(["train", "eagle", "--out", str(tmp_path / "t"), "--steps", "1", "--data", str(few)], capsys)
    assert str(few) in line and "has 8 prompts" in line and "at least 20" in line, line
    assert not (tmp_path / "t").exists()
    examples = [{"i": i, "prompt_ids": [1], "answer_ids": [2]} for i in range(12)]  # ids files: known after reading
    with pytest.raises(answers.DistillError, match="gives 12 examples, 0 of them held out"):
        distill.split_for_training(examples)
    assert [len(side) for side in distill.split_for_training(examples + [{**examples[0], "i": 19}])] == [12, 1]


# -- 4. tree --data that is not self-distillation ids ---------------------------------------------------------------

def test_tree_data_that_is_not_ids_is_one_line_naming_file_and_format(tmp_path, capsys, no_model_loads):
    plain = tmp_path / "plain.txt"
    plain.write_text("just some text\nmore text\n")
    prompts_only = tmp_path / "prompts.jsonl"
    prompts_only.write_text('{"prompt": "hi"}\n')
    for path in (plain, prompts_only):
        line = one_line_exit_2(["tree", str(DRAFTERS / "smollm2-135m-eagle"), "--data", str(path), "--held-out", "5"],
                               capsys)
        assert str(path) in line and "prompt_ids and answer_ids" in line, line


def test_read_examples_names_a_bad_line(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"prompt_ids": [1], "answer_ids": [2]}\nnot json\n')
    with pytest.raises(answers.DistillError, match=rf"^{path}:2 is not .*prompt_ids and answer_ids"):
        answers.read_examples(path)


# -- 5. --resume without a checkpoint -------------------------------------------------------------------------------

def test_resume_without_a_checkpoint_says_it_starts_fresh(tmp_path, capsys, no_model_loads):
    out = tmp_path / "run"
    with pytest.raises(AssertionError, match="a model was loaded"):  # the line comes before the target loads
        main(["train", "eagle", "--out", str(out), "--steps", "1", "--resume"])
    said = capsys.readouterr().out
    assert f"no checkpoint in {out}" in said and "starting fresh" in said, said
