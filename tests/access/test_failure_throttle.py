"""FailureThrottle: free failures, then growing delays, then a block that lifts when
the window has passed; per address, and bounded in memory."""

from reactor_serve.access.failure_throttle import FailureThrottle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_delays_grow_after_the_free_failures_then_the_address_is_blocked():
    clock = Clock()
    throttle = FailureThrottle(window_s=60, free_failures=3, block_after=10,
                               max_delay_s=2.0, clock=clock)
    delays = []
    for _ in range(9):
        throttle.failed("1.2.3.4")
        delays.append(throttle.delay_s("1.2.3.4"))
        assert throttle.retry_after_s("1.2.3.4") is None
    assert delays[:3] == [0.0, 0.0, 0.0]
    assert delays[3] > 0 and delays == sorted(delays) and max(delays) == 2.0
    throttle.failed("1.2.3.4")
    assert throttle.retry_after_s("1.2.3.4") == 60
    assert throttle.retry_after_s("5.6.7.8") is None and throttle.delay_s("5.6.7.8") == 0
    clock.now += 30
    assert throttle.retry_after_s("1.2.3.4") == 30
    clock.now += 31
    assert throttle.retry_after_s("1.2.3.4") is None
    assert throttle.delay_s("1.2.3.4") == 0


def test_memory_is_bounded_oldest_addresses_forgotten_first():
    throttle = FailureThrottle(max_addresses=100, free_failures=0, clock=Clock())
    for index in range(1000):
        throttle.failed(f"10.0.{index // 256}.{index % 256}")
    assert len(throttle._failures) == 100
    assert throttle.delay_s("10.0.3.231") > 0  # the newest is kept
    assert throttle.delay_s("10.0.0.0") == 0
