"""The supported HF families: for each ``model_type`` a config reader (HF -> zoo; its docstring says
what the family becomes), a weight map (run in both directions by zoo.hf.mapping's mappers), a
config writer (zoo -> HF) and the list of zoo settings its transformers classes cannot compute.

One module per family or kind: BERT in bert.py, GPT-2 in gpt2.py, T5 in t5.py, the RoPE decoders
(Llama, Mistral, Qwen2, Qwen3) in rope_decoders.py, Gemma 2 in gemma2.py, Mixtral in mixtral.py,
OLMo 2 in olmo2.py, ModernBERT in modernbert.py, and what they share in common.py. A new family is its
functions and one ``FAMILIES.register`` line at the end of such a module. Importing this module
registers BERT, GPT-2 and T5 in that order (zoo.hf imports rope_decoders after it), and gives the
shared helpers under the names family modules have imported them by.
"""

from __future__ import annotations

from zoo.hf import bert as _bert  # noqa: F401  (registers "bert")
from zoo.hf import gpt2 as _gpt2  # noqa: F401  (registers "gpt2")
from zoo.hf import t5 as _t5  # noqa: F401  (registers "t5")
from zoo.hf.common import BUFFERS, WINDOW, attn_dropout, differs, ids, lm_class, plain

__all__ = ["BUFFERS", "WINDOW", "attn_dropout", "differs", "ids", "lm_class", "plain"]
