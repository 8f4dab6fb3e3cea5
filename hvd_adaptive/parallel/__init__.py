"""Every MPI and Horovod call of a run: the ranks' start and shutdown, object collectives over
mpi4py, the shared batch counter and node-shared model (distributed.py); Horovod's tensor
collectives inside the algorithms' steps (collectives.py); and the weighted merge of the
replicas with its wire format (merge.py)."""
