"""``python -m tasks.cli.attention``: zoo-attention without its script on PATH (``tasks.cli.verbs.attention``, where
Hydra composes the config; the verb's own modules never import ``verbs.py``)."""

from tasks.cli.verbs import attention

if __name__ == "__main__":
    attention()
