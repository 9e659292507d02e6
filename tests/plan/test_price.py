"""Cost per million output tokens (pipeline/plan/price.py) against the practitioner article's worked
example ("What Is Disaggregated Prefill and Decode?", SIVARO, "The Economics") and hand
calculations on the toy model (tests/plan/toy.py)."""

from __future__ import annotations

import pytest

from pipeline.plan.predict import predict
from pipeline.plan.price import cost_per_million_tokens, hourly_price, option_costs
from tests.plan.toy import TOY, TOY_HW, toy_load


def test_the_articles_two_published_figures():
    # Before: a single H100 node at 3.50/hour, 200 tokens/s:
    #   3.50 / (200 x 3600) x 1e6 = 3.50 / 720,000 x 1e6 = 4.8611 -> "4.86 per million".
    before = cost_per_million_tokens(3.50, 200)
    assert before == pytest.approx(4.861111, rel=1e-6)
    assert round(before, 2) == 4.86
    # After: 6 GPUs at 10.50/hour together (1.75 per GPU-hour), 1,100 tokens/s:
    #   10.50 / (1,100 x 3600) x 1e6 = 10.50 / 3,960,000 x 1e6 = 2.6515 -> "2.65 per million".
    assert hourly_price(6, 1.75) == pytest.approx(10.50)
    after = cost_per_million_tokens(hourly_price(6, 1.75), 1100)
    assert after == pytest.approx(2.651515, rel=1e-6)
    assert round(after, 2) == 2.65
    # "Savings: 45% cost reduction": 1 - 2.6515 / 4.8611 = 0.4545.
    assert 1 - after / before == pytest.approx(0.4545, abs=1e-4)
    with pytest.raises(ValueError, match="tokens per second"):
        cost_per_million_tokens(3.50, 0)


def test_each_option_priced_per_pool_by_hand():
    # Toy at 1.5 req/s x 100 output tokens = 150 output tokens/s for both options.
    dis = predict(TOY, TOY_HW, toy_load(rate=1.5), "disaggregated", prefill=2, decode=2)
    colo = predict(TOY, TOY_HW, toy_load(rate=1.5), "colocated", prefill=3)
    # 2 prefill devices x 3.0 + 2 decode devices x 1.0 = 8.0/hour; 8 / (150 x 3600) x 1e6 = 14.815.
    # Colocated: 3 devices x the general 2.0 = 6.0/hour -> 11.111.
    costs = option_costs([dis, colo], 2.0, prefill_price=3.0, decode_price=1.0)
    assert [c.option for c in costs] == ["disaggregated 2P:2D", "colocated x3"]
    assert (costs[0].prefill_devices, costs[0].decode_devices, costs[0].price_per_hour) == (2, 2, 8.0)
    assert costs[0].per_million_output_tokens == pytest.approx(8.0 / 540_000 * 1e6)
    assert costs[1].per_million_output_tokens == pytest.approx(11.1111, rel=1e-4)
    # Pool prices default to the general one: 4 devices x 2.0 = 8.0/hour as well.
    assert option_costs([dis], 2.0)[0].price_per_hour == 8.0
    # Only pool prices: the colocated option has no price and is left out; none at all: [].
    assert [c.option for c in option_costs([dis, colo], None, 3.0, 1.0)] == ["disaggregated 2P:2D"]
    assert option_costs([dis, colo], None) == []
    with pytest.raises(ValueError, match=">= 0"):
        option_costs([dis], -1.0)
