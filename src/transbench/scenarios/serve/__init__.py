"""`transbench serve`: its spec, its cells, the load generator and what one cell measures."""
