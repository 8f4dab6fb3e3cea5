"""Horovod's tensor collectives as the algorithms call them inside their tf.functions: sums of
gradient groups and corrections, and the reduce-scatter and allgather of a sharded layer.

Each takes a `name`: Horovod matches a collective across ranks by it, so every rank must call
the same collectives with the same names in the same order. (The weighted merge of replicas
has its own module, merge.py; object collectives over mpi4py are in distributed.py.)
"""
from __future__ import annotations

import horovod.tensorflow as hvd


def sum_group(tensors: list, name: str) -> list:
    """Every rank's tensors summed, in one fused allreduce (IndexedSlices are allgathered)."""
    return hvd.grouped_allreduce(tensors, op=hvd.Sum, name=name)


def sum_scatter(tensor, name: str):
    """Every rank's tensor summed, and this rank's block of rows of the sum."""
    return hvd.reducescatter(tensor, op=hvd.Sum, name=name)


def mean_scatter(tensor, name: str):
    """Every rank's tensor averaged, and this rank's block of rows of the average."""
    return hvd.reducescatter(tensor, op=hvd.Average, name=name)


def concat_rows(tensor, name: str):
    """Every rank's tensor concatenated along the rows, in rank order."""
    return hvd.allgather(tensor, name=name)
