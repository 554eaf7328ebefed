"""An OpenAI-compatible server over one llama.cpp context with parallel slots: `python -m pyllama_so.server`.

engine.py holds the slots and the thread that batches them, app.py the HTTP endpoints (FastAPI, with
server-sent events from sse-starlette), chat.py the chat templates, schemas.py the request bodies and
errors.py OpenAI's error shape. The HTTP parts need the server extra: pip install "pyllama_so[server]".
"""
