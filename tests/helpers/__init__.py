"""Code the tests share (tests/conftest.py puts tests/ on sys.path: `from helpers.real_models import ...`)."""
