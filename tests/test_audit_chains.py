"""The audit's two sampler chains against llama.cpp's own samplers.

``chain_distribution(..., "temperature-last")`` must be the distribution of
llama-cpp-python's ``Llama`` chain (top-k → top-p → min-p → temperature), and
``"temperature-first"`` that of llama.cpp run with
``--samplers temperature;top_k;top_p;min_p`` (and of specdec-cpu).  The
reference applies llama.cpp's sampler objects to a candidates array and
takes the softmax of what survives.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from specdec_cpu import SamplingParams, sampling
from specdec_cpu.audit import TEMPERATURE_FIRST, TEMPERATURE_LAST, chain_distribution, merge_eog

llama_cpp = pytest.importorskip("llama_cpp")

ORDERS = {
    TEMPERATURE_FIRST: ("temperature", "top_k", "top_p", "min_p"),
    TEMPERATURE_LAST: ("top_k", "top_p", "min_p", "temperature"),
}

CASES = [
    SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.5, top_p=0.8),
    SamplingParams(temperature=0.5, min_p=0.1),
    SamplingParams(temperature=1.3, top_k=20),
    SamplingParams(temperature=0.6, top_k=300, top_p=0.97),
    SamplingParams(temperature=0.0, top_k=40),
]


def llama_cpp_distribution(row: np.ndarray, params: SamplingParams, order) -> np.ndarray:
    """llama.cpp's samplers in ``order`` applied to one row, then a softmax of the survivors."""
    lc = llama_cpp
    make = {
        "temperature": lambda: lc.llama_sampler_init_temp(params.temperature),
        "top_k": lambda: lc.llama_sampler_init_top_k(params.top_k),
        "top_p": lambda: lc.llama_sampler_init_top_p(params.top_p, 1),
        "min_p": lambda: lc.llama_sampler_init_min_p(params.min_p, 1),
    }
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    try:
        for name in order:
            lc.llama_sampler_chain_add(chain, make[name]())
        v = row.size
        buf = np.zeros(v, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        buf["id"] = np.arange(v, dtype=np.int32)
        buf["logit"] = row
        arr = lc.llama_token_data_array(data=buf.ctypes.data_as(lc.llama_token_data_p), size=v,
                                        selected=-1, sorted=False)
        lc.llama_sampler_apply(chain, ctypes.byref(arr))
        kept = buf[: arr.size]
    finally:
        lc.llama_sampler_free(chain)
    logits = kept["logit"].astype(np.float64)
    w = np.exp(logits - logits.max())
    out = np.zeros(row.size)
    out[kept["id"]] = w / w.sum()
    return out


@pytest.mark.parametrize("chain", [TEMPERATURE_FIRST, TEMPERATURE_LAST])
@pytest.mark.parametrize("params", CASES, ids=repr)
def test_chain_matches_llama_cpp_samplers(chain, params):
    rows = (np.random.default_rng(5).normal(size=(3, 5000)) * 3.0).astype(np.float32)
    ours = chain_distribution(rows, params, chain)
    for row, got in zip(rows, ours):
        want = llama_cpp_distribution(row, params, ORDERS[chain])
        np.testing.assert_array_equal(got > 0, want > 0)  # the same support
        np.testing.assert_allclose(got, want, atol=2e-6)
        assert got.sum() == pytest.approx(1.0, abs=1e-9)


def test_the_two_chains_differ_and_first_is_ours():
    row = (np.random.default_rng(6).normal(size=5000) * 3.0).astype(np.float32)
    params = SamplingParams(temperature=0.5, top_p=0.9)
    first = chain_distribution(row, params, TEMPERATURE_FIRST)
    last = chain_distribution(row, params, TEMPERATURE_LAST)
    # A low temperature sharpens before the nucleus is cut: fewer tokens survive.
    assert np.count_nonzero(first) < np.count_nonzero(last)
    np.testing.assert_allclose(first, sampling.distribution(row, params), atol=1e-7)
    with pytest.raises(ValueError, match="chain must be one of"):
        chain_distribution(row, params, "top-k-first")


def test_eog_ids_merge_into_one_outcome():
    probs = np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    logits = np.log(probs).astype(np.float32)
    merged, outs, mlogits = merge_eog(probs.copy(), np.array([3, 1]), [3, 1], logits)
    np.testing.assert_allclose(merged, [[0.1, 0.6, 0.3, 0.0], [0.25, 0.5, 0.25, 0.0]])
    np.testing.assert_array_equal(outs, [1, 1])  # any EOG id is the smallest one
    assert mlogits[0, 1] == pytest.approx(np.log(0.4)) and mlogits[0, 3] == -np.inf
    same, outs2, _ = merge_eog(probs.copy(), np.array([0, 2]), [])
    np.testing.assert_array_equal(same, probs)
