"""pmkb core: taxonomy, incidents, embedding, store, retrieval, evidence, classification."""

__version__ = "0.1.0"
