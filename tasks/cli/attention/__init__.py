"""The attention wing: what zoo-attention runs once Hydra has composed its config
(``tasks.cli.verbs.attention``).

``maps.py`` (``run``): one text through the model, its maps captured; ``heads.py``: the per-head
table; ``plots.py``: the figures. ``python -m tasks.cli.attention`` runs zoo-attention too
(``__main__.py``)."""
