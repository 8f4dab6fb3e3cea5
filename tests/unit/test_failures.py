"""Bad input files and settings the CLI refuses in one process before MPI and TensorFlow start,
each with the one line that names the file or key."""
import pytest

from tests.harness.mpirun import set_args, train_tiny

def test_test_file_with_other_feature_count(tmp_path, small_files):
    # Seen in the files' headers before MPI and TensorFlow start (data.check_sources).
    p = train_tiny(["--run-dir", str(tmp_path / "r")]
            + set_args(data__train=small_files / "train.txt", data__test=small_files / "test250.txt"), ranks=0)
    assert p.returncode == 2, p.stderr[-2000:]
    assert (f"{small_files / 'test250.txt'}:1: header says n_features=250 but 300 was expected"
            in p.stderr), p.stderr[-2000:]


def test_more_ranks_than_synthetic_rows_where_the_launcher_says_the_size():
    from hvd_adaptive.config import load_config
    from hvd_adaptive.data import DataError, check_sources

    cfg, _ = load_config("configs/tiny.yaml", ["data.synth.n_train=2"])
    assert check_sources(cfg, ranks=2) == 2 and check_sources(cfg) == 2
    with pytest.raises(DataError, match="the synthetic training set: only 2 training rows for 3 ranks"):
        check_sources(cfg, ranks=3)


def test_batch_larger_than_data(tmp_path, small_files):
    p = train_tiny(["--run-dir", str(tmp_path / "r")] + set_args(
        data__train=small_files / "train.txt", data__test=small_files / "test.txt", train__batch_size=500),
        ranks=0)  # the training file's header has the row count: before TensorFlow starts
    assert p.returncode == 2, p.stderr[-2000:]
    assert "train.batch_size: 500 is larger than the 200 training rows" in p.stderr, p.stderr


