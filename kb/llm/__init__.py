"""Language models on top of the engine: backends, prompt templates, the retrieval chain, the
LLM-assisted suggester (held to the engine's candidates) and the follow-up chat."""
