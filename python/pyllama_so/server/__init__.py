"""An OpenAI-compatible server over one llama.cpp context with parallel slots: `python -m pyllama_so.server`.

engine/ holds the slots and the thread that batches them; app.py builds the FastAPI app: the routers of
routers/ (openai.py the OpenAI completions and chat, with server-sent events from sse-starlette; native.py
llama-server's /completion, /infill, /tokenize, /detokenize and /apply-template; status.py /health,
/v1/models, /props, /slots, /metrics (metrics.py) and /engine; embeddings.py the embedding routes), the
state they read (routers/state.py), the error handlers (errors.py, with the error shapes) and the middleware
(middleware.py, cors.py); jobs.py turns a request into an engine job, chat.py holds the chat templates,
schemas.py and native_schemas.py the request bodies, settings.py the server's defaults and settings and a
request's settings. The HTTP parts need the server extra: pip install "pyllama_so[server]".
"""
