"""A training run: started on the ranks (run.py), looped over rounds (trainer.py), with the
algorithms (algorithms/), their batch and weight policies (balance.py), the heterogeneity
profiles (hetero.py), the learning rate's choice (tune.py), evaluation across ranks
(evaluation.py), checkpoints (checkpoint.py) and the run folder's records (records.py)."""
