"""Serving models on Ray Serve: one deployment per model, one live session per replica.

Modules: `config` (the application's validated args and per-model deployment options),
`policy` (the session autoscaling policy), `replica` (the model deployment), `metrics`,
and the application builder in `deployments/app.py`.
"""
