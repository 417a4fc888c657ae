"""`mode: serve`: the explorer serves the policy being trained as an OpenAI-compatible HTTP endpoint,
and the calls an application makes become training data (Trinity-RFT's serve mode, AReaL's proxy).

    sessions.py       the record of every answered call, rewards, and commit -> Experiences
    protocol.py       request schemas, limits and OpenAI-style errors
    endpoint_core.py  what the endpoint does without HTTP: generation with the explorer's engines,
                      recording, feedback, commit to the sink (`EndpointCore`)
    openai_app.py     the OpenAI-compatible FastAPI app (/v1/chat/completions, /v1/completions,
                      /v1/models, /health, /v1/feedback, /v1/commit)
    http_server.py    uvicorn inside the explorer's event loop, the endpoint file, taking new weights
    endpoint.py       the endpoint of one explorer (core + app + HTTP server) and serve mode's task
"""
