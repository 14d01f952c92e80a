"""logit_bias and the penalties in SamplingParams: OpenAI's ranges, one error naming the field, and the JSON form that
carries them from the gateway to a worker and from a prefill worker to a decode worker (the KV header's `sampling`)."""
from __future__ import annotations

import pytest

from inference.sampling_params import SamplingError, SamplingParams, parse_sampling, sampling_fields


def test_the_fields_survive_the_trip_from_gateway_to_decode_worker():
    params, stop = parse_sampling({"max_tokens": 8, "logit_bias": {"12": 100, "3": -0.5, "40": 0},
                                   "presence_penalty": 1, "frequency_penalty": -2, "stop": ["\n"]})
    assert params.logit_bias == ((3, -0.5), (12, 100.0))  # sorted by token id, the zero bias dropped
    assert (params.presence_penalty, params.frequency_penalty) == (1.0, -2.0)
    again, again_stop = parse_sampling(sampling_fields(params, stop))
    assert (again, again_stop) == (params, stop)


def test_null_means_absent():
    params, _ = parse_sampling({"logit_bias": None, "presence_penalty": None, "frequency_penalty": None})
    assert params == SamplingParams() and not params.adjusts_logits


def test_python_callers_may_key_by_integer():
    assert SamplingParams(logit_bias={7: 2}).logit_bias == ((7, 2.0),)


@pytest.mark.parametrize("body, param, code", [
    ({"logit_bias": [[1, 2]]}, "logit_bias", "invalid_type"),
    ({"logit_bias": "1:2"}, "logit_bias", "invalid_type"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"-1": 1}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"1.5": 1}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"1": 100.5}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"1": -101}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"1": "5"}}, "logit_bias", "invalid_type"),
    ({"logit_bias": {"1": True}}, "logit_bias", "invalid_type"),
    ({"logit_bias": {"1": 1, "01": 2}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "invalid_value"),
    ({"presence_penalty": 2.5}, "presence_penalty", "invalid_value"),
    ({"presence_penalty": "1"}, "presence_penalty", "invalid_type"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", "invalid_value"),
    ({"frequency_penalty": 1e400}, "frequency_penalty", "invalid_type"),
])
def test_a_bad_value_is_an_error_naming_the_field(body, param, code):
    with pytest.raises(SamplingError) as raised:
        parse_sampling(body)
    assert (raised.value.param, raised.value.code) == (param, code)
    assert str(raised.value).startswith(param)


def test_300_biases_and_the_range_ends_are_accepted():
    params, _ = parse_sampling({"logit_bias": {str(i): (100 if i % 2 else -100) for i in range(300)},
                                "presence_penalty": -2, "frequency_penalty": 2})
    assert len(params.logit_bias) == 300
