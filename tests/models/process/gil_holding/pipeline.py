# A model whose forward pass holds the GIL: pure-Python arithmetic for
# config["hold_s"] seconds, then a block of 12 frames, as Python-heavy pipelines do.
import time

import numpy as np

from reactor_runtime.interface import ReactorPipeline


class GilHolding(ReactorPipeline):
    fps = 24
    buffer_size = 24

    def load(self, config):
        self.hold_s = float(config.get("hold_s", 0.5))
        self.block = np.zeros((12, 48, 64, 3), np.uint8)

    def inference(self):
        while True:
            began = time.monotonic()
            end = time.perf_counter() + self.hold_s
            total = 0
            while time.perf_counter() < end:
                for i in range(2000):
                    total += i * i
            # Each block carries when the hold that made it began and ended, on the
            # machine's monotonic clock, so a test can tell what the media side did
            # meanwhile. A fresh block each time: the one yielded may still be read.
            block = self.block.copy()
            block[:, 0, :16, 0] = np.array([began, time.monotonic()], np.float64).view(np.uint8)
            yield block
