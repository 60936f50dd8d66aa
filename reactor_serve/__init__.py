"""reactor-serve: serve real-time interactive video models written against the Reactor model API."""

__version__ = "0.1.0"
