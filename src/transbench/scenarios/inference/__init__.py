"""`transbench run`: the inference grid: its spec, its cells, what one cell measures."""
