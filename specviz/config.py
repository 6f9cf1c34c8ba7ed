"""DecodeConfig: every decoding knob and its default, defined once.

Validation lives here too, so the CLI, the app and the engines share one set of
one-line error messages ("gamma=0 is out of range: use an integer 1..16 or 'auto'").
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Union

from specviz import methods
from specviz.errors import ConfigError

DEFAULT_TARGET = "smollm2-135m"  # the embedded SmolLM2-135M-Instruct
DEFAULT_DRAFT = "int8"           # an int8 copy of the target
GAMMA_MAX = 16
MAX_NEW_TOKENS_CAP = 2048
# the tree drafters' tree shapes (DecodeConfig.tree): the drafter's stored tree, or one grown each step (EAGLE-2)
TREE_SHAPES = ("static", "dynamic")
TREE_NODES_MAX = 64   # nodes of a dynamic tree (DecodeConfig.tree_nodes)
TREE_TOPK_MAX = 16    # children per expanded node (DecodeConfig.tree_topk)


Gamma = Union[int, str]  # 1..GAMMA_MAX or "auto"


@dataclass(frozen=True)
class DecodeConfig:
    # "ar" | "vanilla" (a draft model) | "pld" (prompt lookup) | "eagle" | "medusa" | "layerskip" | "draft"
    method: str = "vanilla"
    gamma: Gamma = 4                 # drafted tokens per step, or "auto" (adaptive)
    temperature: float = 0.0         # 0 = greedy; > 0 = exact speculative sampling
    top_k: int = 0                   # 0 = off; else keep the k most likely tokens
    top_p: float = 1.0               # nucleus mass in (0, 1]; 1 = off
    max_new_tokens: int = 128        # exact cap on emitted tokens
    seed: int = 0                    # seeds the run's own torch.Generator
    # adaptive gamma ("auto"): start, bounds, and the early-stop confidence
    gamma_auto_start: int = 4
    gamma_auto_min: int = 1
    gamma_auto_max: int = 12
    draft_confidence: float = 0.4    # auto: stop drafting when the draft's top prob falls below this
    # prompt lookup
    pld_ngram_max: int = 3           # longest suffix n-gram searched for in the context
    pld_ngram_min: int = 1
    # tree drafters (eagle, medusa): also verify prompt lookup's continuation, up to this many tokens, as one more
    # branch of the tree (0 = off); greedy or sampling (a point-mass candidate: docs/exactness.md)
    lookup: int = 0
    # likewise up to this many nodes retrieved from the datastore of the target's own answers: a chain where the
    # answers agree, a fork where they split (specviz/core/retrieval.py; 0 = off)
    retrieve: int = 0
    # tree drafters (eagle, medusa): "static" verifies the drafter's stored tree; "dynamic" grows one each step from
    # the drafter's own confidence (EAGLE-2): tree_topk children for each of the tree_topk most probable nodes of a
    # level, tree_depth levels deep (γ caps it too), then the tree_nodes nodes of highest path probability (the
    # product of the drafter's probabilities along the path). Defaults: the shipped EAGLE's measured acceptance
    # (experiments/probes/dynamic_tree_calibration.py): levels past 3 add nothing, k 4 beats 2 (k > 4 not measured yet),
    # and more nodes little per node against the verify profile's T(k) (docs/drafters.md, "Dynamic trees").
    tree: str = "static"
    tree_nodes: int = 8
    tree_depth: int = 3
    tree_topk: int = 4

    def __post_init__(self) -> None:
        validate(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adaptive(self) -> bool:
        return self.gamma == "auto"

    def initial_gamma(self) -> int:
        return self.gamma_auto_start if self.adaptive else int(self.gamma)

    def with_(self, **changes) -> "DecodeConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_gamma(value) -> Gamma:
    """'auto' or an integer 1..GAMMA_MAX, from a string, int or float."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"gamma={value!r} is not valid: use an integer 1..{GAMMA_MAX} or 'auto'") from None
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"gamma={value!r} is not valid: use an integer 1..{GAMMA_MAX} or 'auto'")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= GAMMA_MAX:
        raise ConfigError(f"gamma={value!r} is out of range: use an integer 1..{GAMMA_MAX} or 'auto'")
    return value


def number(name: str, value, kind=float, use: str = ""):
    """value as a `kind` (float or int), or a one-line ConfigError naming `name` and, given `use`, what is accepted
    ("use 1..2048"): booleans, NaN and a fractional value for an integer are refused."""
    said = f": {use}" if use else ""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a number{said}")
    try:
        out = kind(value)
    except (TypeError, ValueError):
        try:  # '2.5' for an integer: a number, not an integer
            float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={value!r} is not a number{said}") from None
        raise ConfigError(f"{name}={value!r} is not an integer{said}") from None
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{name}={value!r} is not an integer{said}")
    if out != out:  # NaN
        raise ConfigError(f"{name}={value!r} is not a number{said}")
    return out


def validate(cfg: DecodeConfig) -> None:
    """Raise ConfigError with a one-line message for the first bad field. Normalises types in place."""
    set_ = lambda k, v: object.__setattr__(cfg, k, v)  # noqa: E731  (frozen dataclass normalisation)
    spec = methods.spec(cfg.method)  # an unknown name: the registry's one-line ConfigError
    set_("gamma", parse_gamma(cfg.gamma))
    use = "use 0 (greedy) up to 100"
    t = number("temperature", cfg.temperature, use=use)
    if not 0.0 <= t <= 100.0:
        raise ConfigError(f"temperature={t:g} is out of range: {use}")
    set_("temperature", t)
    use = "use 0 (off) or a positive integer"
    k = number("top_k", cfg.top_k, int, use)
    if k < 0:
        raise ConfigError(f"top_k={k} is out of range: {use}")
    set_("top_k", k)
    use = "use a number in (0, 1]"
    p = number("top_p", cfg.top_p, use=use)
    if not 0.0 < p <= 1.0:
        raise ConfigError(f"top_p={p:g} is out of range: {use}")
    set_("top_p", p)
    use = f"use 1..{MAX_NEW_TOKENS_CAP}"
    n = number("max_new_tokens", cfg.max_new_tokens, int, use)
    if not 1 <= n <= MAX_NEW_TOKENS_CAP:
        raise ConfigError(f"max_new_tokens={n} is out of range: {use}")
    set_("max_new_tokens", n)
    use = "use an integer 0..2^63-1"
    s = number("seed", cfg.seed, int, use)
    if not 0 <= s < 2**63:
        raise ConfigError(f"seed={s} is out of range: {use}")
    set_("seed", s)
    if not 1 <= cfg.gamma_auto_min <= cfg.gamma_auto_start <= cfg.gamma_auto_max <= GAMMA_MAX:
        raise ConfigError("auto gamma bounds must satisfy 1 <= min <= start <= max <= %d" % GAMMA_MAX)
    if not 0.0 <= cfg.draft_confidence < 1.0:
        raise ConfigError(f"draft_confidence={cfg.draft_confidence!r} is out of range: use [0, 1)")
    if not 1 <= cfg.pld_ngram_min <= cfg.pld_ngram_max:
        raise ConfigError("prompt lookup n-gram bounds must satisfy 1 <= min <= max")
    for branch in ("lookup", "retrieve"):  # the branches grafted onto a tree drafter's tree
        use = f"use 0 (off) up to {GAMMA_MAX} {'tokens' if branch == 'lookup' else 'nodes'}"
        n = number(branch, getattr(cfg, branch), int, use)
        if not 0 <= n <= GAMMA_MAX:
            raise ConfigError(f"{branch}={n} is out of range: {use}")
        if n and branch not in spec.grafts:
            raise ConfigError(f"{branch}={n} applies to the tree drafters only: use it with "
                              f"{' or '.join(methods.names(lambda s: branch in s.grafts))}, not {cfg.method}")
        set_(branch, n)
    if cfg.tree not in TREE_SHAPES:
        raise ConfigError(f"tree={cfg.tree!r} is unknown: use static (the drafter's own tree) or dynamic (grown each "
                          "step from the drafter's confidence)")
    if cfg.tree == "dynamic" and not spec.tree:
        raise ConfigError(f"tree='dynamic' applies to the tree drafters only: use it with "
                          f"{' or '.join(methods.names(lambda s: s.tree))}, not {cfg.method}")
    for name, high, what in (("tree_nodes", TREE_NODES_MAX, "nodes"), ("tree_depth", GAMMA_MAX, "levels"),
                             ("tree_topk", TREE_TOPK_MAX, "children per node")):
        use = f"use 1..{high} {what}"
        n = number(name, getattr(cfg, name), int, use)
        if not 1 <= n <= high:
            raise ConfigError(f"{name}={n} is out of range: {use}")
        set_(name, n)


MAX_PROMPT_CHARS = 16000


def check_prompt(prompt) -> str:
    """The prompt text, or a one-line ConfigError for an empty or oversized one."""
    if prompt is not None and not isinstance(prompt, str):
        raise ConfigError(f"prompt={prompt!r:.40} is not text: type a question or an instruction")
    if not prompt or not prompt.strip():
        raise ConfigError("prompt is empty: type a question or an instruction")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"prompt has {len(prompt)} characters: the limit is {MAX_PROMPT_CHARS}")
    at = unencodable(prompt)
    if at is not None:
        raise ConfigError(f"prompt has a lone surrogate U+{ord(prompt[at]):04X} at character {at}, which no text "
                          "encoding holds: paste the text again (an emoji cut in half?)")
    return prompt


def unencodable(text: str) -> int | None:
    """The index of the first character UTF-8 cannot encode (a lone surrogate, e.g. half an emoji pair from a JSON
    escape or a script), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
