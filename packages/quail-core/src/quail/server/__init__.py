"""`quail serve`: one warm engine shared over HTTP — the API, the web page, and the sessions behind them.

Needs the `serve` extra (`pip install 'quail-core[serve]'`: Starlette on uvicorn); the client, `quail.connect`,
needs nothing beyond quail-core.
"""
