"""The `cuda` backend: Qwen2/Llama passes at one fixed shape, row-exact by construction,
replayed as CUDA graphs (forward.py), with its Triton kernels (attention.py, rope_store.py),
its pass layout (passlayout.py, chained.py) and its settings (settings.py)."""
