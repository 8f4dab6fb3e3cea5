"""TensorFlow for the package's modules: `from hvd_adaptive.tfload import tf`.

Importing TensorFlow (2.21) imports Keras eagerly, and Keras imports matplotlib.pyplot when
matplotlib is installed, for plotting helpers hvd_adaptive never calls. matplotlib is installed
for `hvd-adaptive report`, and importing pyplot took 0.6-0.7 s of every rank's start-up here
(TensorFlow and Horovod take about 4 s in all). So the first import of TensorFlow in a process
sees matplotlib as absent (Keras then leaves its plotting helpers unset); right after it,
matplotlib is importable again, for the report or anyone else.
"""
import sys

if "tensorflow" not in sys.modules and "matplotlib" not in sys.modules:
    sys.modules["matplotlib"] = None  # an import of matplotlib or its parts raises ImportError
    try:
        import tensorflow  # noqa: F401
    finally:
        if "matplotlib" in sys.modules and sys.modules["matplotlib"] is None:
            del sys.modules["matplotlib"]

import tensorflow as tf  # noqa: E402

__all__ = ["tf"]
