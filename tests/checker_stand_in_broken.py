"""A runtime that is installed but cannot be imported (tests/checker_stand_ins.py, ``Unimportable``)."""

raise RuntimeError("Failed to load shared library 'libllama.so': undefined symbol: ggml_backend_reg")
