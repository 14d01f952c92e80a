"""Sampling parameters and their one validation, shared by the engine, the worker protocol and the gateway.

Every field is checked here, once. Each edge turns a `SamplingError` into its own answer: the worker and the gateway
into a 400 naming `param`, the engine into the ValueError it is. A JSON body's sampling fields (a worker request, the
`sampling` object of a KV header, an OpenAI request the gateway has mapped) go through `parse_sampling`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inference.checks import is_int, is_number, json_type

DEFAULT_MAX_TOKENS = 16
OPENAI_MAX_TEMPERATURE = 2.0  # OpenAI's documented range is [0, 2]; the engine would take up to 100
# The fields a deployment may give defaults for: the gateway fills them into a request that leaves them out.
SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "max_tokens")
MAX_STOP_STRINGS = 16
MAX_STOP_LEN = 256
# OpenAI's ranges: a bias of +-100 all but forces or bans a token; penalties in [-2, 2].
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_PENALTY = 2.0


class SamplingError(ValueError):
    """A bad sampling field: `param` names it, `code` says whether its type or its value is wrong."""

    def __init__(self, param: str, requirement: str, code: str = "invalid_value"):
        super().__init__(f"{param} {requirement}")
        self.param, self.requirement, self.code = param, requirement, code


@dataclass(slots=True, frozen=True)
class SamplingParams:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None
    ignore_eos: bool = False
    # (token id, bias) pairs sorted by token id, zero biases dropped; given as OpenAI's {"token id": bias} or as
    # {token_id: bias}. Token ids are checked against the vocabulary where it is known (the worker, the engine).
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Whether the sampler adds a logit bias or penalties for this request: computed once, read by every step (a batch
    # in which no request does costs the sampler nothing).
    adjusts_logits: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise _error("max_tokens", "must be an integer >= 1", self.max_tokens, type_ok=is_int(self.max_tokens))
        if not is_number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            raise _error("temperature", "must be a number in [0, 100]", self.temperature,
                         type_ok=is_number(self.temperature))
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise _error("top_p", "must be a number in (0, 1]", self.top_p, type_ok=is_number(self.top_p))
        if not is_int(self.top_k) or self.top_k < 0:
            raise _error("top_k", "must be an integer >= 0", self.top_k, type_ok=is_int(self.top_k))
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise _error("seed", "must be null or an integer in [0, 2^63)", self.seed, type_ok=is_int(self.seed))
        if not isinstance(self.ignore_eos, bool):
            raise _error("ignore_eos", "must be a boolean", self.ignore_eos, type_ok=False)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not is_number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise _error(name, f"must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]", value,
                             type_ok=is_number(value))
            object.__setattr__(self, name, float(value))
        # An integer temperature or top_p (JSON's 1) is stored as the float it means; frozen, hence object.__setattr__.
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        object.__setattr__(self, "adjusts_logits", bool(self.logit_bias) or self.presence_penalty != 0.0
                           or self.frequency_penalty != 0.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _error(param: str, requirement: str, value, *, type_ok: bool) -> SamplingError:
    return SamplingError(param, f"{requirement}, got {value!r}", code="invalid_value" if type_ok else "invalid_type")


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} (or {token_id: bias}, or the stored pairs) -> sorted (token id, bias) pairs
    without zero biases; SamplingError naming logit_bias otherwise."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, tuple):
        items = list(value)
    else:
        raise SamplingError("logit_bias", f"must be an object mapping token ids to biases, got {json_type(value)}",
                            code="invalid_type")
    if len(items) > MAX_LOGIT_BIAS_ENTRIES:
        raise SamplingError("logit_bias", f"may hold at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(items)}")
    biases: dict[int, float] = {}
    for item in items:
        key, bias = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        if is_int(key) and key >= 0:
            token_id = key
        elif isinstance(key, str) and 0 < len(key) <= 12 and key.isascii() and key.isdigit():
            token_id = int(key)
        else:
            raise SamplingError("logit_bias", f"keys must be token ids (integers >= 0, as strings), got {key!r}")
        if not is_number(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise SamplingError("logit_bias", f"biases must be numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                                              f"got {bias!r} for token {key!r}",
                                code="invalid_value" if is_number(bias) else "invalid_type")
        if token_id in biases:
            raise SamplingError("logit_bias", f"names token {token_id} twice")
        biases[token_id] = float(bias)
    return tuple(sorted((token_id, bias) for token_id, bias in biases.items() if bias != 0.0))


def parse_stop(stop) -> list[str]:
    """null, one string, or a list of strings -> a list of 1-MAX_STOP_LEN character strings."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise SamplingError("stop", "must be a string or a list of strings", code="invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise SamplingError("stop", f"may hold at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
    if any(not s or len(s) > MAX_STOP_LEN for s in stop):
        raise SamplingError("stop", f"strings must be 1-{MAX_STOP_LEN} characters")
    return stop


def parse_sampling(body: Mapping, *, allow_null_max_tokens: bool = False) -> tuple[SamplingParams, list[str]]:
    """The sampling fields of a JSON body; absent fields (and a null temperature, top_p or top_k) take defaults.

    With `allow_null_max_tokens`, a null max_tokens stands for "up to the end of the context", which only the worker
    that tokenized the prompt can resolve: the params then carry a placeholder of 1 that the caller replaces.
    """
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None and allow_null_max_tokens:
        max_tokens = 1

    def or_default(name: str, default):
        value = body.get(name)
        return default if value is None else value

    params = SamplingParams(max_tokens=max_tokens, temperature=or_default("temperature", 0.0),
                            top_p=or_default("top_p", 1.0), top_k=or_default("top_k", 0), seed=body.get("seed"),
                            ignore_eos=body.get("ignore_eos", False), logit_bias=body.get("logit_bias"),
                            presence_penalty=or_default("presence_penalty", 0.0),
                            frequency_penalty=or_default("frequency_penalty", 0.0))
    return params, parse_stop(body.get("stop"))


def check_sampling_defaults(defaults: Mapping) -> dict:
    """Sampling defaults (a subset of SAMPLING_DEFAULT_FIELDS; null means unset) checked by the rules a request's
    own fields meet at the gateway, so that a default can never make a request invalid. top_k -1 (vLLM's "no
    top-k") is stored as 0. Raises SamplingError naming the field."""
    unknown = sorted(set(defaults) - set(SAMPLING_DEFAULT_FIELDS))
    if unknown:
        raise SamplingError(unknown[0], f"is not a sampling default; allowed: {', '.join(SAMPLING_DEFAULT_FIELDS)}",
                            code="unknown_parameter")
    cleaned = {name: value for name, value in defaults.items() if value is not None}
    if is_int(cleaned.get("top_k")) and cleaned["top_k"] == -1:
        cleaned["top_k"] = 0
    params = SamplingParams(**cleaned)  # raises SamplingError naming the field
    if params.temperature > OPENAI_MAX_TEMPERATURE:
        raise SamplingError("temperature", f"must be in [0, {OPENAI_MAX_TEMPERATURE:g}], got {cleaned['temperature']}")
    return {name: getattr(params, name) for name in SAMPLING_DEFAULT_FIELDS if name in cleaned}


def sampling_fields(params: SamplingParams, stop: list[str]) -> dict:
    """The JSON form `parse_sampling` reads: a worker request's sampling fields, a KV header's `sampling` object."""
    return {"max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "seed": params.seed, "ignore_eos": params.ignore_eos, "stop": list(stop),
            "logit_bias": {str(token_id): bias for token_id, bias in params.logit_bias},
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty}
