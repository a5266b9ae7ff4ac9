"""The suggestion engine without a model: embedding, the vector store, hybrid retrieval,
evidence, node history, classification and its calibration, mitigations."""
