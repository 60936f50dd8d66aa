"""The environment a test Ray's Serve controller gets, so that a machine whose cores the
suite (and the load script) hold does not have its HTTP proxy killed.

Serve's controller gives a new proxy 5 s to say it is ready and a running one 10 s to
answer each health check, and kills it after three misses; `serve run` then dies with
`ActorDiedError`. Both are read from the controller's environment when it starts. The
tests are of reactor-serve, not of how Ray's proxy copes with a stalled machine.
"""

__all__ = ["SERVE_PROXY_ENV"]

SERVE_PROXY_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
}
