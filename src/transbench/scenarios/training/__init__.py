"""`transbench train`: its spec, its cells, the training loop and the ladder."""
