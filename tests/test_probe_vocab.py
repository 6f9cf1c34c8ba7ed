"""probe checks the served vocabulary before it judges (serving/vocab.py), and reads vLLM's per-request figures
(`metrics.speculative_decoding`, --per-request-spec-decode-metrics). Fake OpenAI-compatible servers: one serving
"our" vocabulary, one another (another model id, another tokenizer), one without /tokenize."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specviz.cli.main import main
from specviz.serving import probe, vocab
from specviz.serving.vocab import Expected, VocabMismatch

OURS = lambda text: [ord(c) % 1000 for c in text]  # noqa: E731  a stand-in vocabulary: one id a character
OTHER = lambda text: [len(w) for w in text.split()]  # noqa: E731  another: one id a word
# vLLM's per-request answer (--per-request-spec-decode-metrics summary): 12 steps kept 0, 1, 2, 3 drafts
SPEC = {"mean_acceptance_length": 1 + 15 / 12, "draft_acceptance_rate": 15 / 36, "acceptance_histogram": [4, 3, 3, 2],
        "num_spec_steps": 12, "num_accepted_draft_tokens": 15, "num_draft_tokens": 36, "num_spec_tokens": 3}


@pytest.fixture
def servers():
    """start(model, tokenize) -> (url, posts): an OpenAI-compatible server; tokenize None: no /tokenize."""
    running = []

    def start(model: str, tokenize, llama_cpp: bool = False):
        posts: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, status, data):
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                posts.append(self.path)
                if self.path == "/tokenize" and llama_cpp:  # llama-server reads "content" only: 200 and no tokens else
                    self._json(200, {"tokens": tokenize(body["content"]) if "content" in body else []})
                elif self.path == "/tokenize" and tokenize is not None and "prompt" in body:
                    assert body["add_special_tokens"] is False
                    self._json(200, {"tokens": tokenize(body["prompt"]), "count": 0, "max_model_len": 2048})
                elif self.path == "/v1/chat/completions":
                    self._json(200, {"model": model, "choices": [{"message": {"content": "four"},
                                                                  "finish_reason": "length"}],
                                     "usage": {"completion_tokens": 27}, "metrics": {"speculative_decoding": SPEC}})
                else:
                    self._json(404, {"error": "not found"})

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        running.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", posts

    yield start
    for server in running:
        server.shutdown()
        server.server_close()


ROWS = [{"id": 1, "category": "qa", "prompt": "2 + 2?"}]
OPTIONS = probe.ProbeOptions(max_new_tokens=8, temperature=0)
EXPECTED = Expected("smollm2-135m", tuple(OURS(vocab.SAMPLE)))


def test_another_vocabulary_is_refused_in_one_line_before_any_request(servers):
    url, posts = servers("Qwen/Qwen2.5-0.5B-Instruct", OTHER)
    with pytest.raises(VocabMismatch) as info:
        probe.run_probe(url, ROWS, OPTIONS, expect=EXPECTED, log=lambda line: None)
    line = str(info.value)
    assert "'Qwen/Qwen2.5-0.5B-Instruct'" in line and "otherwise than smollm2-135m" in line
    assert "serves another vocabulary" in line and "\n" not in line
    assert posts == ["/tokenize"]  # nothing judged: no completion was asked for


def test_the_same_vocabulary_passes_and_vllm_per_request_figures_are_read(servers):
    url, posts = servers("smollm2-135m", OURS)
    data = probe.run_probe(url, ROWS, OPTIONS, expect=EXPECTED, log=lambda line: None)
    assert data["vocabulary"]["checked_against"] == ["smollm2-135m"] and posts[0] == "/tokenize"
    g = data["by_mode"]["greedy"]
    assert data["engine"] == "vllm" and data["requests"][0]["source"] == "metrics.speculative_decoding"
    assert (g["draft_tokens"], g["accepted_tokens"], g["drafts"]) == (36, 15, 12)
    assert g["tau"] == pytest.approx(SPEC["mean_acceptance_length"])  # our τ is vLLM's mean acceptance length
    assert g["acceptance_rate"] == pytest.approx(SPEC["draft_acceptance_rate"])
    assert g["accepted_lengths"] == [4, 3, 3, 2] and "keeping 0, 1, 2, … drafts" in probe.format_probe(data)


def test_a_reference_with_another_vocabulary_is_refused_and_the_cli_exits_2(servers, tmp_path, capsys):
    url, _ = servers("smollm2-135m", OURS)
    ref, ref_posts = servers("meta-llama/Llama-3.2-1B", OTHER)
    with pytest.raises(VocabMismatch, match="tokenize the sample differently"):
        probe.run_probe(url, ROWS, OPTIONS, reference=ref, log=lambda line: None)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    assert main(["probe", url, "--prompts", str(prompts), "--reference", ref]) == 2
    err = capsys.readouterr().err
    assert "'meta-llama/Llama-3.2-1B'" in err and err.count("\n") == 1 and "Traceback" not in err
    assert "/v1/chat/completions" not in ref_posts


def test_a_server_without_tokenize_is_a_note_not_a_refusal(servers):
    url, _ = servers("smollm2-135m", None)
    notes = []
    data = probe.run_probe(url, ROWS, OPTIONS, expect=EXPECTED, log=notes.append)
    assert data["vocabulary"]["unchecked"] and any("has no /tokenize" in n for n in notes)
    assert data["by_mode"]["greedy"]["requests"] == 1


def test_a_llama_server_is_asked_in_its_own_words(servers):
    """llama-server answers vLLM's /tokenize body with 200 and no tokens (it reads "content"): that empty answer must
    not pass for its vocabulary; its own body gets the real ids, which match."""
    url, posts = servers("target-f32.gguf", OURS, llama_cpp=True)
    assert vocab.served_tokens(url) == OURS(vocab.SAMPLE)
    assert vocab.check_served(url, EXPECTED)["checked_against"] == ["smollm2-135m"]
    other, _ = servers("target-f32.gguf", lambda text: [7] * len(text), llama_cpp=True)
    with pytest.raises(VocabMismatch):
        vocab.check_served(other, EXPECTED)
