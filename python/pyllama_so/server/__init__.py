"""An OpenAI-compatible server over one llama.cpp context with parallel slots: `python -m pyllama_so.server`.

engine.py holds the slots and the thread that batches them; app.py the OpenAI endpoints (FastAPI, with
server-sent events from sse-starlette) and the middleware, native.py llama-server's /completion, /infill,
/tokenize and /detokenize, status.py /props, /slots, /metrics (metrics.py) and /engine; jobs.py turns a
request into an engine job, chat.py holds the chat templates, schemas.py and native_schemas.py the request
bodies, settings.py the server's defaults and a request's settings, errors.py the error shapes. The HTTP
parts need the server extra: pip install "pyllama_so[server]".
"""
