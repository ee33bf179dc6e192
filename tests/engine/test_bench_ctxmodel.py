"""The issue-36 model study (tools/bench/ctxmodel.py) on made-up data: its bit counts against
entropies worked out by hand, its float fields, and the layout's keyframe rule."""
from __future__ import annotations

import math

import numpy as np

from tools.bench.ctxmodel import (TABLE_BITS, VALUE_ESCAPE, adaptive_bits, cond_bits, delta_bits, delta_value_bits,
                                  fields, layout)


def test_cond_bits_is_the_entropy_per_context_plus_the_tables():
    sym = np.array([0, 1, 0, 1, 2, 2, 2, 2])
    # order 0: counts 2, 2, 4 of 8 -> 1.5 bits each; three cells
    assert math.isclose(cond_bits(sym), 8 * 1.5 + 3 * TABLE_BITS)
    # context 0 holds 0,1,0,1 (1 bit each), context 1 holds 2,2,2,2 (0 bits): three cells
    ctx = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert math.isclose(cond_bits(sym, ctx), 4 * 1.0 + 3 * TABLE_BITS)


def test_fields_of_bf16_and_fp32():
    one = np.array([0x3F80], np.int64)  # bf16 1.0: sign 0, exponent 127, mantissa 0
    se, top, e = fields(one, "BF16")
    assert (se[0], top[0], e[0]) == (127, 0, 127)
    x = np.frombuffer(np.array([-1.5], np.float32).tobytes(), np.uint32).astype(np.int64)
    se, top, e = fields(x, "F32")
    assert (se[0], top[0], e[0]) == (256 + 127, 0x40, 127)  # sign set; 1.5 = 1.1b: top mantissa bit


def test_a_delta_of_equal_pieces_costs_only_its_table():
    rng = np.random.default_rng(1)
    x = rng.integers(0x3000, 0x4000, 4096).astype(np.int64)
    assert delta_bits(x, x, "BF16") <= 40 * TABLE_BITS  # one symbol (length 0) in each context used
    y = x + rng.integers(-3, 4, x.size)  # log2(7) = 2.8 bits of difference per element, and tables
    assert 2.8 * x.size < delta_bits(x, y, "BF16") < 8 * x.size


def test_the_delta_value_model_prices_runs_and_small_values_and_escapes_the_rest():
    rng = np.random.default_rng(3)
    x = rng.integers(0x3000, 0x4000, 8192).astype(np.int64)
    y = x.copy()
    y[::16] += 1  # a run of 15 unchanged elements, then a difference of one: z = 1
    value = delta_value_bits(x, y, "BF16", adaptive=True)
    assert value < delta_bits(x, y, "BF16", adaptive=True)
    # entropy of the two symbols by context (after z = 1, z = 0 for sure; after 0, 1 in 15)
    assert value < 8192 / 16 * 15 * (-(1 / 15) * math.log2(1 / 15) - (14 / 15) * math.log2(14 / 15)) + 200
    # differences at and past the escape cost their bit length and the bits below the leading one
    far = x + VALUE_ESCAPE  # d = -64: z = 127, length 7, 6 bits below
    assert 6 * x.size <= delta_value_bits(x, far, "BF16") <= 6 * x.size + 40 * TABLE_BITS


def test_layout_takes_the_smallest_allowed_and_keyframes_use_no_newer_version():
    row = {"category": "c", "logical": 100, "engine whole": 60, "engine delta": 50, "whole order 0": 55,
           "whole given v": None, "whole given newer": 40, "delta given newer": 20}
    costs = {"pieces": [[dict(row)] for _ in range(4)]}
    assert layout(costs, 0, context=False)["c"] == 4 * 50
    assert layout(costs, 0, context=True)["c"] == 4 * 20
    # k=2: versions 1 and 3 are keyframes
    assert layout(costs, 2, context=True)["c"] == 2 * 20 + 2 * 55
    # a delta that saves less than a tenth is not one the engine keeps
    costs = {"pieces": [[dict(row, **{"engine delta": 58})]]}
    assert layout(costs, 0, context=False)["c"] == 60
    # the same bytes stored with a newer piece cost nothing (global dedup)
    costs = {"pieces": [[dict(row, dup=True)], [dict(row)]]}
    assert layout(costs, 0, context=True)["c"] == 20


def _kt_sequential(sym: np.ndarray, ctx: np.ndarray) -> float:
    """An adaptive coder's bits, coded one symbol at a time: counts start at 1/2 for each
    symbol of the alphabet (the symbols the data holds) in every context."""
    alphabet = sorted(set(sym.tolist()))
    counts: dict[int, dict[int, float]] = {}
    bits = 0.0
    for s, c in zip(sym.tolist(), ctx.tolist()):
        table = counts.setdefault(c, {a: 0.5 for a in alphabet})
        bits -= math.log2(table[s] / sum(table.values()))
        table[s] += 1
    return bits


def test_adaptive_bits_are_what_a_sequential_adaptive_coder_pays():
    # two symbols coded in order: 1/2 for the first, 1/4 for the second: 3 bits, and the
    # alphabet named by one bit per possible symbol (2)
    assert math.isclose(adaptive_bits(np.array([0, 1])), 3 + 2)
    assert math.isclose(adaptive_bits(np.array([0, 0, 0, 0])), 0 + 1)  # one symbol: nothing to code
    rng = np.random.default_rng(7)
    sym = rng.choice([0, 1, 3, 6], 400, p=[0.6, 0.2, 0.15, 0.05])
    ctx = rng.integers(0, 3, 400)
    max_symbol = 7  # the alphabet named by one bit per possible symbol, 0 to 6
    assert math.isclose(adaptive_bits(sym, ctx), _kt_sequential(sym, ctx) + max_symbol, rel_tol=1e-9)
    # with one context, the adaptive price of skewed data is near its entropy, and below a
    # static table's (which pays TABLE_BITS per cell)
    assert adaptive_bits(sym) < cond_bits(sym)


def test_the_adaptive_layout_takes_the_adaptive_price_where_it_is_smaller():
    row = {"category": "c", "logical": 100, "engine whole": 60, "engine delta": None, "whole order 0": 55,
           "whole order 0 adaptive": 50, "whole given newer": 40, "whole given newer adaptive": 45}
    costs = {"pieces": [[dict(row)], [dict(row)]]}
    assert layout(costs, 0, context=True)["c"] == 2 * 40
    assert layout(costs, 0, context=True, adaptive=True)["c"] == 2 * 40
    assert layout(costs, 2, context=True)["c"] == 40 + 55  # version 1 a keyframe
    assert layout(costs, 2, context=True, adaptive=True)["c"] == 40 + 50
