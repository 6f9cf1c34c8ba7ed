"""specviz: see and check speculative decoding."""

__version__ = "0.1.0"
