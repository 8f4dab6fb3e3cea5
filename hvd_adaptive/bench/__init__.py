"""Tooling around training that the core never imports: the speed benchmark (speed.py) with its
plain Horovod contender (plain_horovod.py), the scaling study (scaling.py), the merge's cost
(merge_cost.py), the accuracy benchmark (accuracy.py) beside a label tree (trees.py),
experiment sweeps (sweep.py) and reports of run folders (report.py)."""
