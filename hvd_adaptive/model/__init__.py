"""The network and its optimizers (network.py) and the metrics of a ranking (metrics.py): no
MPI or Horovod call lives here."""
