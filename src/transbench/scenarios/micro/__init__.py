"""Micro-benchmarks: the ceilings of the device (gemm, bandwidth), the cost of one transformer layer and of its
parts (layer, breakdown), and the collectives between GPUs (collectives, through torchrun). One stored cell per
measured point.

    from transbench.scenarios.micro import GemmOptions, run_micro
    outcome = run_micro("gemm", GemmOptions(sizes=[4096, 8192], dtypes=["bf16"]), db="bench.db")
"""

from .ceilings import measured_ceilings
from .options import (BandwidthOptions, BreakdownOptions, CollectivesOptions, GemmOptions, LayerOptions,
                      parse_byte_sizes, parse_sizes)
from ...report.roofline import roofline_points
from .run import KINDS, MicroOutcome, plot_micro, run_micro

__all__ = ["BandwidthOptions", "BreakdownOptions", "CollectivesOptions", "GemmOptions", "KINDS", "LayerOptions",
           "MicroOutcome", "measured_ceilings", "parse_byte_sizes", "parse_sizes", "plot_micro", "roofline_points",
           "run_micro"]
