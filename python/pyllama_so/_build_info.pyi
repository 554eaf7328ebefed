# Types of _build_info.py, which CMake writes from _build_info.py.in at build time: mypy checks a clean checkout.
UPSTREAM_COMMIT: str
UPSTREAM_SDIST: str
COMPILED_BACKENDS: tuple[str, ...]
