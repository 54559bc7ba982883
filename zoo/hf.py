def from_hf(m): raise RuntimeError
def from_hf_config(c): raise RuntimeError
