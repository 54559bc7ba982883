"""The export wing: what zoo-export runs once Hydra has composed its config (``tasks.cli.verbs.export``).

``exporting.py`` (``run``): the verb; ``formats.py``: one registered class per export format, written
by ``hf.py``, ``gguf.py`` and ``onnx.py`` (safetensors in ``formats.py``); ``destination.py``: what
``out=`` may be; ``card.py``: the model card; ``checker.py``: the runtimes that check a file, in a
child process. ``python -m tasks.cli.export`` runs zoo-export too (``__main__.py``)."""
