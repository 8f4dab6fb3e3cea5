"""What the tests run on: real MPI jobs, several cases in one set of ranks, a real algorithm
built on the ranks, trained runs, nodes made of network namespaces, a real Slurm cluster."""
