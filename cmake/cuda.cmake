# The CUDA backend: added to the kvtier target when a CUDA compiler is found.
# (Filled in by the CUDA data-plane work; until then CUDA builds are CPU-only.)
