# A model that dies on request, each way a model process can die: a segfault in
# native code, os._exit, a SIGKILL as the out-of-memory killer sends, an exception in
# a handler. Its load() fails while the file named by config["fail_load_if"] exists,
# so a test can make the reloads after a crash fail, then let them succeed again; it
# does not return while the file named by config["hold_load_while"] exists, so a test
# can hold a reload as long as it needs (a large model loading). Asked to
# "close_channel_and_stop", it shuts its end of the channel to the media process and
# stops itself: alive, and past answering, as a process tearing down its ranks before
# it exits.
# Frames carry torch tensors, so their crossing into shared memory is exercised too.
import ctypes
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch

from reactor_runtime.interface import ReactorPipeline, event


class Crashing(ReactorPipeline):
    fps = 30
    buffer_size = 4

    def load(self, config):
        hold = config.get("hold_load_while")
        while hold and Path(hold).exists():
            time.sleep(0.05)
        marker = config.get("fail_load_if")
        if marker and Path(marker).exists():
            raise RuntimeError(f"simulated load failure ({marker} exists)")
        self.count = 0
        self.hang = False
        # Touched once the forward pass is stuck, so a test can wait for that.
        self.hanging_marker = config.get("hanging_marker")
        self.exit_now = False

    @event(name="crash", description="Die in the way named")
    def crash(self, how: str = "segfault"):
        if how == "segfault":
            ctypes.string_at(0)
        elif how == "exit":
            os._exit(3)
        elif how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "hang":
            self.hang = True
        elif how == "sys.exit":
            self.exit_now = True
        elif how == "close_channel_and_stop":
            fd = int(sys.argv[sys.argv.index("--channel-fd") + 1])
            socket.socket(fileno=os.dup(fd)).shutdown(socket.SHUT_RDWR)
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            raise RuntimeError(f"simulated handler failure: {how}")

    def inference(self):
        while True:
            self.count += 1
            frame = torch.full((48, 64, 3), self.count % 256, dtype=torch.uint8)
            frame[0, 0, 0] = 7  # a mark the test checks for
            time.sleep(0.01)
            if self.hang and self.hanging_marker:
                Path(self.hanging_marker).touch()
            while self.hang:  # a forward pass that never returns
                time.sleep(1)
            if self.exit_now:
                sys.exit(5)  # ends the model's loop, not the process
            yield frame
