"""Every MPI and Horovod call of a run: the ranks' start and shutdown, their collectives, the
shared batch counter and node-shared model (distributed.py), and the weighted merge of the
replicas with its wire format (merge.py)."""
