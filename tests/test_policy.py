"""Public mode: allow-listed models only, no local paths, caps on prompt, tokens and γ."""
import pytest

from specviz.config import DecodeConfig
from specviz.errors import ConfigError
from specviz.policy import Policy


def test_private_mode_allows_everything(monkeypatch):
    monkeypatch.delenv("SPECVIZ_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    policy = Policy.from_env()
    assert not policy.public
    assert policy.check_model("/some/local/folder") == "/some/local/folder"
    assert policy.check_config(DecodeConfig(max_new_tokens=2048, gamma=16)).gamma == 16


def test_public_mode_restricts(monkeypatch):
    monkeypatch.setenv("SPECVIZ_PUBLIC", "1")
    monkeypatch.setenv("SPECVIZ_MAX_NEW_TOKENS", "64")
    policy = Policy.from_env()
    assert policy.check_model("smollm2-135m") == "smollm2-135m"
    for spec in ("/etc/passwd", "../model.gguf", "evil/repo"):
        with pytest.raises(ConfigError, match="is not available here"):
            policy.check_model(spec, "target")
    with pytest.raises(ConfigError, match="max_new_tokens=65 is above the limit here: use 1..64"):
        policy.check_config(DecodeConfig(max_new_tokens=65))
    with pytest.raises(ConfigError, match="gamma=9"):
        policy.check_config(DecodeConfig(gamma=9, max_new_tokens=32))
    assert policy.check_config(DecodeConfig(gamma="auto", gamma_auto_max=12, max_new_tokens=32)).gamma_auto_max == 8
    with pytest.raises(ConfigError, match="limit here is 4000"):
        policy.check_prompt("x" * 4001)


def test_allow_list_from_env(monkeypatch):
    monkeypatch.setenv("SPECVIZ_PUBLIC", "1")
    monkeypatch.setenv("SPECVIZ_ALLOWED_MODELS", "a/b, c/d")
    assert Policy.from_env().allowed_models == ("a/b", "c/d")
    monkeypatch.setenv("SPECVIZ_MAX_GAMMA", "many")
    with pytest.raises(ConfigError, match="SPECVIZ_MAX_GAMMA='many' is not an integer"):
        Policy.from_env()


def test_a_hugging_face_space_is_public_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("SPECVIZ_PUBLIC", raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    assert Policy.from_env().public
    monkeypatch.setenv("SPECVIZ_PUBLIC", "0")
    assert not Policy.from_env().public
