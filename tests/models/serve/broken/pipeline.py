# A model whose load() fails, as a missing checkpoint would.
from reactor_runtime.interface import ReactorPipeline


class Broken(ReactorPipeline):
    def load(self, config):
        raise FileNotFoundError("checkpoint /weights/model.pt is missing")

    def inference(self):
        yield None
