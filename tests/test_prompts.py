"""specviz.prompts: the one reader of prompt files (JSONL, gzipped or not, and plain text) and the round-robin pick."""
import gzip

import pytest

from specviz import prompts


def test_reads_jsonl_turns_text_and_plain_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"question_id": 81, "category": "writing", "turns": ["first", "second"]}\n\n'
                 '{"id": "x", "prompt": "two"}\n{"text": "three"}\n')
    assert prompts.read(f) == [{"id": 81, "category": "writing", "prompt": "first"},
                               {"id": "x", "category": "-", "prompt": "two"},
                               {"id": 4, "category": "-", "prompt": "three"}]
    txt = tmp_path / "p.txt"
    txt.write_text("one prompt\n\n another \n")
    assert [r["prompt"] for r in prompts.read(txt)] == ["one prompt", "another"]
    gz = tmp_path / "p.jsonl.gz"
    with gzip.open(gz, "wt") as out:
        out.write('{"prompt": "zipped"}\n')
    assert prompts.read(gz)[0]["prompt"] == "zipped"


@pytest.mark.parametrize("body,kwargs,message", [
    ("{oops\n", {}, "p.jsonl:1 is not valid JSON"),
    ('{"turns": []}\n', {}, "p.jsonl:1 has no 'prompt' text (nor 'turns' or 'text')"),
    ('{"text": "t"}\n', {"fields": ("prompt",)}, "p.jsonl:1 has no 'prompt' text"),
    ("plain\n", {"jsonl_only": True}, "p.jsonl:1 is not valid JSON"),
    ("\n\n", {}, "holds no prompts"),
])
def test_bad_files_give_one_line(tmp_path, body, kwargs, message):
    f = tmp_path / "p.jsonl"
    f.write_text(body)
    with pytest.raises(prompts.PromptFileError) as err:
        prompts.read(f, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(prompts.PromptFileError, match="does not exist"):
        prompts.read(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(prompts.PromptFileError, match="cannot be read"):
        prompts.read(bad)


def test_pick_round_robin_and_categories():
    rows = [{"id": i, "category": c, "prompt": str(i)} for i, c in enumerate("aaabbc")]
    assert [r["id"] for r in prompts.pick(rows, limit=4)] == [0, 3, 5, 1]
    assert [r["id"] for r in prompts.pick(rows, ["b"])] == [3, 4]
    with pytest.raises(prompts.PromptFileError, match=r"categories \['z'\] are not in f: use some of a, b, c"):
        prompts.pick(rows, ["z"], source="f")
    with pytest.raises(prompts.PromptFileError, match="limit=0 is out of range"):
        prompts.pick(rows, limit=0)
