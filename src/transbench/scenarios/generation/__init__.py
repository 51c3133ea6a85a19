"""`transbench run --task generate`: what one generation cell measures."""
