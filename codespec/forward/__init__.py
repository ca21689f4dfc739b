"""Forward backends: a model's prefill and verify passes behind one protocol (base.py).

    base.py          the `Forward` protocol, its vocabulary and exactness contract
    select.py        the one place that picks a backend at start-up, and why (`load`, `of_model`)
    rows.py          `rowdecoder`: the C row decoder (rowdecoder.py, kernels/rowdecoder.c)
      direct.py        ... its weights from safetensors without torch (weights.py, tokenizer.py)
      hf_weights.py    ... its weights from a transformers model
    transformers.py  `transformers` (row-exact: attention.py, rowcalls.py, rowblocks.py,
                     rowplan.py)
    codespec/forward/cuda/   `cuda`: fixed-shape passes in CUDA graphs, with its Triton kernels and
                     settings (a package of its own)
    profile.py       the machine profile each backend's probes and pass timings are stored in

Nothing here imports torch at module level except the transformers backend's modules,
which select.py imports only when it picks them. The package itself imports nothing:
`from codespec.forward.select import load, of_model`.
"""
