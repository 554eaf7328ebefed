"""The server's HTTP routes, one FastAPI router per feature: openai.py (OpenAI's completions and chat), native.py
(llama-server's /completion, /infill, /tokenize, /detokenize, /apply-template), status.py (/health, /v1/models,
/props, /slots, /engine, /metrics) and embeddings.py (the embedding routes). Handlers are top-level functions;
what they share (the engine, the chat template, the settings) they read from app.state through the
dependencies of state.py. app.create_app includes the routers."""
