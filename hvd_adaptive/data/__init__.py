"""Dataset I/O, synthetic XMC data, batching, loading a run's data (numpy only, no TensorFlow)."""
from .batching import Batch, epoch_permutation, make_batch
from .formats import DataError, Dataset, iter_rows, load_dataset, parse_file, write_xc
from .loading import check_fits, check_sources, load_data, split_validation
from .synth import PRESETS, SynthSpec, preset, synth_to_files, synthesize, synthesize_cached

__all__ = [
    "Batch", "DataError", "Dataset", "PRESETS", "SynthSpec", "check_fits", "check_sources",
    "epoch_permutation", "iter_rows",
    "load_data", "load_dataset", "make_batch", "parse_file", "preset", "synth_to_files", "synthesize",
    "split_validation", "synthesize_cached",
    "write_xc",
]
