"""Console verbs (zoo-train, zoo-eval, zoo-generate, zoo-export): straight lines of instantiate
calls over the Hydra configs in conf/."""
