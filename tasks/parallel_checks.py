"""The old home of tensor parallelism's checks, kept so that old imports work: they live in
tasks.parallel.checks, and ``whole_parameters`` in tasks.parallel.plan."""

from tasks.parallel.checks import (
    DATA_PARALLEL,
    check_data_parallel,
    check_devices,
    check_sequence_parallel,
    check_tensor_parallel,
)
from tasks.parallel.plan import whole_parameters

__all__ = [
    "DATA_PARALLEL",
    "check_data_parallel",
    "check_devices",
    "check_sequence_parallel",
    "check_tensor_parallel",
    "whole_parameters",
]
