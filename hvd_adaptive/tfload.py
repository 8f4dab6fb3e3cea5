"""TensorFlow for the package's modules: `from hvd_adaptive.tfload import tf`.

Importing TensorFlow (2.21) imports Keras eagerly, and Keras imports matplotlib.pyplot when
matplotlib is installed, for plotting helpers hvd_adaptive never calls. matplotlib is installed
for `hvd-adaptive report`, and importing pyplot added a noticeable share to every rank's
start-up (docs/benchmark.md, "Figures behind the code's defaults"). So the first import of
TensorFlow in a process sees matplotlib as absent (Keras then leaves its plotting helpers
unset); right after it, matplotlib is importable again, for the report or anyone else.

The first import also logs INFO lines through absl's C++ logging before absl is initialized
("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
then "I0000 ... port.cc:153] oneDNN custom operations are on ..."). On some hosts TensorFlow
2.21 writes them whatever TF_CPP_MIN_LOG_LEVEL says (seen on an AMD EPYC host: level 3 still
printed them). So where TF_CPP_MIN_LOG_LEVEL asks for quiet (1 or more: INFO filtered, as
TensorFlow documents it), the import's stderr goes through `tflines.start_up_filter`, which
drops those INFO lines and absl's notice and passes everything else on (warnings, errors,
tracebacks).
"""
import os
import sys
import tempfile

from hvd_adaptive.tflines import start_up_filter


def _quiet() -> bool:
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "")
    return level.isdigit() and int(level) >= 1


def _import_tensorflow() -> None:
    """The first import of TensorFlow: without matplotlib (unless something imported it
    already), its start-up lines filtered if quiet."""
    if "matplotlib" not in sys.modules:
        sys.modules["matplotlib"] = None  # an import of matplotlib or its parts raises ImportError
    saved = None
    capture = tempfile.TemporaryFile() if _quiet() else None
    try:
        if capture is not None:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(capture.fileno(), 2)
        import tensorflow  # noqa: F401
    finally:
        if "matplotlib" in sys.modules and sys.modules["matplotlib"] is None:
            del sys.modules["matplotlib"]
        if capture is not None:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            rest = start_up_filter(capture.read())
            capture.close()
            if rest:
                os.write(2, rest)


if "tensorflow" not in sys.modules:
    _import_tensorflow()

import tensorflow as tf  # noqa: E402

__all__ = ["tf"]
