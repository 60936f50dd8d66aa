"""`LossRateControl`: grow on a clean link, hold on a lossy one, cut past capacity."""

import pytest

from reactor_serve.rtc.loss_rate_control import LossRateControl


def test_a_clean_link_grows_the_rate_by_time_up_to_the_ceiling():
    control = LossRateControl(1_000_000, 300_000, 1_500_000)
    assert control.report(0.0, 10.0) == 1_080_000
    assert control.report(0.01, 12.0) == int(1_080_000 * 1.08 ** 2)
    for t in range(13, 40):
        control.report(0.0, float(t))
    assert control.bps == 1_500_000


def test_moderate_loss_holds_and_heavy_loss_cuts_by_half_of_it_to_the_floor():
    control = LossRateControl(1_000_000, 300_000, 6_000_000)
    assert control.report(0.05, 1.0) == 1_000_000
    assert control.report(0.4, 2.0) == 800_000
    for t in range(3, 20):
        control.report(1.0, float(t))
    assert control.bps == 300_000


@pytest.mark.parametrize("start, expected", [(50_000, 300_000), (9_000_000, 6_000_000)])
def test_the_start_is_kept_within_the_range(start, expected):
    assert LossRateControl(start, 300_000, 6_000_000).bps == expected
