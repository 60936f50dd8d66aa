"""The kind drivers: how a pipeline, a run loop and a `VideoModel` are run, behind one `KindDriver` protocol."""
