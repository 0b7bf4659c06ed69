"""Fixtures for engine tests: the real SmolLM2 tokenizer is the session fixture `smollm2_tokenizer`
of tests/conftest.py (loaded once for the whole run)."""
