"""`transbench tune`: its spec and the tuning of one model over a batch x seq grid."""
