"""Console verbs (zoo-train, zoo-eval, zoo-generate, zoo-export, zoo-attention): ``verbs.py`` is every
entry, where Hydra composes the config in conf/; each verb is a package here (``train/``, ``evaluate/``,
``generate/``, ``export/``, ``attention/``) whose ``run(cfg)`` does its work and whose ``__main__.py``
is ``python -m tasks.cli.<verb>``; the modules at this level are what the verbs share."""
