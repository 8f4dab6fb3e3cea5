"""hvd_adaptive: adaptive SGD for sparse XMC on heterogeneous Horovod ranks."""
__version__ = "0.1.0"
