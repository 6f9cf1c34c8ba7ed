"""What a deployment allows. A public Space sets SPECVIZ_PUBLIC=1: then only allow-listed model ids, no
local paths, and caps on prompt length, max_new_tokens, γ and run time. Operators configure it with
environment variables (read once per call, so tests and operators can change them):

  SPECVIZ_PUBLIC=1                 public mode on (the default on a Hugging Face Space, where SPACE_ID is
                                   set, and in the Docker image); SPECVIZ_PUBLIC=0 turns it off
  SPECVIZ_ALLOWED_MODELS=a,b       model specs allowed in public mode (default: ALLOWED_DEFAULT)
  SPECVIZ_MAX_PROMPT_CHARS=4000    public caps (defaults below)
  SPECVIZ_MAX_NEW_TOKENS=256
  SPECVIZ_MAX_GAMMA=8
  SPECVIZ_MAX_RUN_SECONDS=120
  SPECVIZ_TRUST_REMOTE_CODE=1      let transformers run a model repo's own code (off by default, any mode)
  SPECVIZ_WATCH_HOSTS=a,b          hosts the "Watch a server" tab may scrape in public mode (default: none; loopback
                                   and private addresses are refused even when listed); outside it, the non-public
                                   hosts or addresses it may scrape: link-local ones (cloud metadata) always need
                                   naming, loopback and private ones too when the app listens beyond loopback
                                   (GRADIO_SERVER_NAME=0.0.0.0): specviz/serving/access.py
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from specviz.config import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    GAMMA_MAX,
    MAX_NEW_TOKENS_CAP,
    MAX_PROMPT_CHARS,
    DecodeConfig,
)
from specviz.errors import ConfigError

ALLOWED_DEFAULT = (DEFAULT_TARGET, DEFAULT_DRAFT, "HuggingFaceTB/SmolLM2-135M-Instruct",
                   "HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct")


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class Policy:
    public: bool = False
    allowed_models: tuple[str, ...] = ALLOWED_DEFAULT
    max_prompt_chars: int = MAX_PROMPT_CHARS
    max_new_tokens: int = MAX_NEW_TOKENS_CAP
    max_gamma: int = GAMMA_MAX
    max_run_seconds: float = float("inf")

    @classmethod
    def from_env(cls) -> "Policy":
        public = os.environ.get("SPECVIZ_PUBLIC", "1" if os.environ.get("SPACE_ID") else "0").strip()
        if public != "1":
            return cls()
        allowed = os.environ.get("SPECVIZ_ALLOWED_MODELS")
        return cls(
            public=True,
            allowed_models=tuple(m.strip() for m in allowed.split(",") if m.strip()) if allowed else ALLOWED_DEFAULT,
            max_prompt_chars=_int_env("SPECVIZ_MAX_PROMPT_CHARS", 4000),
            max_new_tokens=_int_env("SPECVIZ_MAX_NEW_TOKENS", 256),
            max_gamma=_int_env("SPECVIZ_MAX_GAMMA", 8),
            max_run_seconds=float(_int_env("SPECVIZ_MAX_RUN_SECONDS", 120)),
        )

    def check_model(self, spec: str, role: str = "model") -> str:
        """Public mode: only allow-listed specs (so no local paths). Private: anything resolve() accepts."""
        if self.public and spec not in self.allowed_models:
            raise ConfigError(f"{role} {spec!r} is not available here: use one of {', '.join(self.allowed_models)}")
        return spec

    def check_prompt(self, prompt: str) -> str:
        if self.public and isinstance(prompt, str) and len(prompt) > self.max_prompt_chars:
            raise ConfigError(f"prompt has {len(prompt)} characters: the limit here is {self.max_prompt_chars}")
        return prompt

    def check_config(self, cfg: DecodeConfig) -> DecodeConfig:
        if cfg.max_new_tokens > self.max_new_tokens:
            raise ConfigError(f"max_new_tokens={cfg.max_new_tokens} is above the limit here: "
                              f"use 1..{self.max_new_tokens}")
        if cfg.gamma != "auto" and cfg.gamma > self.max_gamma:
            raise ConfigError(f"gamma={cfg.gamma} is above the limit here: use 1..{self.max_gamma} or 'auto'")
        if cfg.adaptive and cfg.gamma_auto_max > self.max_gamma:
            cfg = cfg.with_(gamma_auto_max=self.max_gamma, gamma_auto_start=min(cfg.gamma_auto_start, self.max_gamma))
        return cfg
