"""`mode: serve`: the explorer serves the policy being trained as an OpenAI-compatible HTTP endpoint,
and the calls an application makes become training data (Trinity-RFT's serve mode, AReaL's proxy).

    sessions.py   the record of every answered call, rewards, and commit -> Experiences
    protocol.py   request schemas, limits and OpenAI-style errors
    backend.py    generation with the explorer's engines, recording, feedback, commit to the sink
    app.py        the FastAPI routes (/v1/chat/completions, /v1/completions, /v1/models, /health,
                  /v1/feedback, /v1/commit)
    server.py     uvicorn inside the explorer's event loop, the endpoint file, taking new weights
"""
