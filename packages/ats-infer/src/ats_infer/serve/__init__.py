"""`ats-infer serve`: an OpenAI-compatible HTTP server (the `serve` extra: FastAPI, uvicorn,
pydantic, prometheus-client) with continuous batching over the engine's batch of slots. The
native path imports no torch."""
