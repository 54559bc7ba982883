"""The article study: the design article's claims tested at small scale, written up as a results page.

Run it from a checkout with ``python -m scripts.article.run`` (driver.py: the options and the run). One
module per experiment (positions, norm, ffn, scale, kv_cache, sizes, heads), each with its claim, its run and
whatever it adds to the page; common.py holds what they share and page.py writes the page.
"""
