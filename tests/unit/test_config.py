"""Config: YAML -> dataclasses, overrides, and the errors that name the key."""
import json
import os
import subprocess
import sys

import pytest

from hvd_adaptive.config import Config, ConfigError, config_from_dict, load_config, resolve
from tests.harness.mpirun import REPO


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_without_file():
    cfg, extras = load_config(None)
    assert cfg == Config()
    assert extras == {}
    assert cfg.train.algorithm == "sync" and cfg.model.hidden == "auto"


def test_a_round_holds_at_least_two_batches_a_rank():
    # 2,048-row windows of 256-row batches: as configured up to 4 ranks, then two batches a rank.
    train = config_from_dict({"train": {"window_samples": 2048, "batch_size": 256}}).train
    assert [train.window_rows(n) for n in (1, 2, 4, 8, 16)] == [2048, 2048, 2048, 4096, 8192]


def test_file_then_overrides_win(tmp_path):
    p = write(tmp_path, "train:\n  batch_size: 64\n  algorithm: local\nmodel:\n  hidden: [32, 16]\n")
    cfg, _ = load_config(p, ["train.batch_size=128", "hetero.slowdown={1: 2.0}"])
    assert cfg.train.batch_size == 128          # --set wins over the file
    assert cfg.train.algorithm == "local"       # file wins over the default
    assert cfg.model.hidden == [32, 16]
    assert cfg.hetero.slowdown == {1: 2.0}
    assert cfg.optim.lr == Config().optim.lr    # default kept


@pytest.mark.parametrize("hetero, sleeps", [
    ({}, False), ({"slowdown": {1: 1.0}}, False), ({"slowdown": {1: 2.0}}, True),
    ({"schedule": [{"from_epoch": 0.5, "slowdown": {1: 2.0}}]}, True), ({"jitter": 0.1}, True),
    ({"mode": "cpu_quota", "slowdown": {1: 2.0}}, False)])
def test_whether_a_run_sleeps_is_read_from_the_config(hetero, sleeps):
    # Every rank decides sync's step from it (fused, or timed for the sleeps), so it cannot
    # depend on the rank's own factor: rank 0 runs at full speed while rank 1 sleeps.
    assert config_from_dict({"hetero": hetero}).hetero.sleeps is sleeps


@pytest.mark.parametrize("text, needle", [
    ("train:\n  batchsize: 3\n", "train.batchsize: unknown key"),
    ("trian:\n  epochs: 3\n", "trian: unknown key"),
    ("data:\n  synth:\n    scael: 2\n", "data.synth.scael: unknown key"),
    ("train:\n  batch_size: many\n", "train.batch_size: expected an integer"),
    ("train:\n  batch_size: -4\n", "train.batch_size: must be > 0"),
    ("optim:\n  lr: true\n", "optim.lr: expected a number"),
    ("model:\n  hidden: [64, 0]\n", "model.hidden: widths must be positive ([] for a linear model)"),
    ("model:\n  hidden: []\n  output: sampled\n", "model.hidden: [] (a linear model) reads every label"),
    ("model:\n  hidden: []\n  dropout: 0.5\n", "model.dropout: acts on hidden activations"),
    ("model:\n  loss: sigmoid\n  output: sampled\n", "model.loss: sigmoid scores every label"),
    ("model:\n  loss: sigmoid\n  label_smoothing: 0.1\n", "model.loss: sigmoid scores every label"),
    ("model:\n  loss: logistic\n", "model.loss"),
    ("model:\n  hidden: wide\n", "model.hidden: must be one of ['auto'], got 'wide' or expected a list"),
    ("model:\n  label_smoothing: 1.0\n", "model.label_smoothing: must be in [0, 1)"),
    ("model:\n  dropout_after: -1\n", "model.dropout_after: must be >= 0 epochs"),
    ("model:\n  label_smoothing: 0.1\n  output: sampled\n", "model.label_smoothing: spreads the target"),
    ("hetero:\n  slowdown: {1: 0.5}\n", "hetero.slowdown"),
    ("sync:\n  step: split\n", "sync.step"),
    ("adaptive:\n  b_min: 512\n  b_max: 64\n", "adaptive.b_min"),
    ("data:\n  train: a.txt\n", "data: train and test must both be"),
    ("merge:\n  chunk_mb: -1\n", "merge.chunk_mb: must be >= 0"),
    ("train:\n  algorithm: adaptive\nmerge:\n  overlap: true\n  dtype: float16\n",
     "merge.overlap: needs merge.dtype float32"),
    ("train:\n  algorithm: sync\nmerge:\n  overlap: true\n",
     "merge.overlap: only adaptive SGD overlaps its merge"),
    ("train:\n  algorithm: adaptive\nadaptive:\n  merge_momentum: 0.5\nmerge:\n  overlap: true\n",
     "merge.overlap: block momentum"),
    ("adaptive:\n  merge_lr: 0\n", "adaptive.merge_lr: must be in (0, 1]"),
    ("optim:\n  lr: 0.05\n  lr_scale: 0.5\n", "optim.lr_scale: scales the rate optim.lr auto "
     "chooses, but optim.lr is pinned at 0.05; pin the rate you want (0.025?)"),
    ("optim:\n  lr_scale: 0\n", "optim.lr_scale"),
    ("checkpoint:\n  keep: -1\n", "checkpoint.keep: must be >= 0"),
    ("checkpoint:\n  keep: 0\n  every: 4\n", "checkpoint.every: 4 with checkpoint.keep 0"),
    ("checkpoint:\n  keep: 0\n  resume: auto\n", "checkpoint.resume: auto (--resume) with checkpoint.keep 0"),
    ("- 1\n- 2\n", "top level must be a mapping"),
    ("train: [\n", "not valid YAML"),
])
def test_bad_values_name_the_key_and_file(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert needle in str(e.value)
    assert str(p) in str(e.value)


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(None, ["train.epochs"])
    with pytest.raises(ConfigError, match="train.nope: unknown key"):
        load_config(None, ["train.nope=1"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_an_error_names_where_its_value_came_from_the_set_item_or_the_file(tmp_path):
    p = write(tmp_path, "optim:\n  eps: 1.0e-7\ntrain:\n  epochs: -1\n")
    # The file's bad value, with an unrelated --set: the file is named, not the --set.
    with pytest.raises(ConfigError) as e:
        load_config(p, ["optim.lr=0.1"])
    assert str(e.value).startswith(f"{p}: train.epochs")
    # A bad value from --set over a good file: the --set item is named, not the file.
    p = write(tmp_path, "optim:\n  eps: 1.0e-7\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, ["train.epochs=2", "optim.lr_scale=0"])
    assert str(e.value).startswith("--set optim.lr_scale=0: optim.lr_scale")
    assert str(p) not in str(e.value)
    # A section given whole by --set, and an unknown key under it.
    with pytest.raises(ConfigError) as e:
        load_config(p, ["optim={lr: 0.1, nope: 1}"])
    assert str(e.value).startswith("--set optim={lr: 0.1, nope: 1}: optim.nope: unknown key")
    # Without a file every default is valid: the --set items are the cause, named.
    with pytest.raises(ConfigError) as e:
        load_config(None, ["checkpoint.keep=0", "checkpoint.every=4"])
    assert str(e.value).startswith("--set checkpoint.every=4: checkpoint.every: 4 with")


def test_extra_sections_pass_through(tmp_path):
    p = write(tmp_path, "sweep:\n  grid: {optim.lr: [0.1, 0.2]}\n")
    cfg, extras = load_config(p, extra_sections=("sweep",))
    assert extras == {"sweep": {"grid": {"optim.lr": [0.1, 0.2]}}}
    with pytest.raises(ConfigError, match="sweep: unknown key"):
        load_config(p)


def test_round_trip_through_json():
    cfg, _ = load_config(None, ["hetero.slowdown={1: 3.0}", "train.epochs=2.5"])
    back = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg


def test_a_runs_config_json_is_a_config_file_again(tmp_path):
    # config.json writes 1e-08 (json.dumps), which YAML 1.1 reads as a string; so does a user's
    # "eps: 1e-8". Both must load as the number, and a word must still be refused.
    cfg, _ = load_config(None, ["optim.eps=1e-8", "optim.lr=2.5e-1"])
    assert (cfg.optim.eps, cfg.optim.lr) == (1e-8, 0.25)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    again, _ = load_config(tmp_path / "config.json")
    assert again == cfg
    (tmp_path / "bad.yaml").write_text("optim:\n  eps: tiny\n")
    with pytest.raises(ConfigError, match="optim.eps: expected a number, got 'tiny'"):
        load_config(tmp_path / "bad.yaml")


def test_shipped_configs_load():
    shipped = sorted((REPO / "configs").glob("*.yaml"))
    assert len(shipped) >= 5, shipped  # the folder found: a wrong path must not pass empty
    for p in shipped:
        load_config(p, extra_sections=("sweep",))


def test_algorithm_registry_without_tensorflow_until_built():
    # Config, the CLI and thread sizing read the registry before TensorFlow may start; every
    # name must still resolve to an Algorithm class once TensorFlow is there.
    code = """
import importlib, sys
from hvd_adaptive import cli
from hvd_adaptive.train import run
from hvd_adaptive.bench import sweep
from hvd_adaptive.train.algorithms import ALGORITHMS, worker_threads
from hvd_adaptive.config import load_config
cfg, _ = load_config(None, ["train.algorithm=adaptive_hogbatch", "hogbatch.cpu_ranks=[1]",
                            "hogbatch.cpu_threads=1", "train.threads=2"])
assert (worker_threads(cfg, 0), worker_threads(cfg, 1)) == (2, 1)
loaded = sorted(m for m in sys.modules if m.startswith(("tensorflow", "horovod", "hvd_adaptive.train.algorithms.")))
assert not loaded, loaded
from hvd_adaptive.train.algorithms import Algorithm
for name, target in ALGORITHMS.items():
    module, _, cls = target.partition(":")
    assert issubclass(getattr(importlib.import_module(module), cls), Algorithm), name
# hvd_adaptive.tfload: TensorFlow came without matplotlib (Keras' plotting), which stays importable
assert "tensorflow" in sys.modules and "matplotlib" not in sys.modules
import matplotlib.pyplot
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert p.returncode == 0, p.stderr[-3000:]


def test_config_is_the_ground_floor():
    # A fresh interpreter: building and validating a config loads no other module of the
    # package (no registry above it) and neither scipy nor TensorFlow. The names those
    # registries own are checked by them (tests/unit/test_cli.py).
    code = """
import sys
from hvd_adaptive.config import load_config
load_config(None, ["train.algorithm=adaptive", "data.synth.preset=eurlex4k"])
print(sorted(m for m in sys.modules if m.startswith("hvd_adaptive.")),
      sorted({m.split(".")[0] for m in sys.modules} & {"scipy", "tensorflow"}))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "['hvd_adaptive.config'] []", p.stdout


def test_resolve_fills_every_value_derived_from_another():
    # Defaults: adaptive.b_min 32 and hogbatch.b_min 16; a batch of 16 puts adaptive's b_max
    # (train.batch_size) under its b_min, which the algorithm then lowers to b_max.
    cfg, _ = load_config(None, ["train.batch_size=16", "train.eval_every=0.25"])
    r = resolve(cfg, threads=3)
    assert (r.train.threads, r.hogbatch.cpu_threads) == (3, 3)
    assert (r.adaptive.b_max, r.adaptive.b_min) == (16, 16)
    assert (r.hogbatch.gpu_batch, r.hogbatch.b_max, r.hogbatch.b_min) == (16, 8 * 16, 16)
    assert r.hogbatch.round_epochs == 0.25
    assert config_from_dict(json.loads(json.dumps(r.to_dict()))) == r  # config.json reads back
    assert r.train.time_budget_s is None and r.train.eval_rows is None  # None meaning "none" stays


def test_resolve_keeps_values_that_were_given():
    cfg, _ = load_config(None, ["train.threads=2", "hogbatch.cpu_threads=1", "adaptive.b_max=512",
                                "hogbatch.gpu_batch=64", "hogbatch.b_max=100", "hogbatch.round_epochs=1"])
    r = resolve(cfg, threads=3)
    assert (r.train.threads, r.hogbatch.cpu_threads, r.adaptive.b_max, r.adaptive.b_min) == (2, 1, 512, 32)
    assert (r.hogbatch.gpu_batch, r.hogbatch.b_max, r.hogbatch.round_epochs) == (64, 100, 1.0)
    assert resolve(r, threads=5) == r
    cfg, _ = load_config(None, ["train.threads=2"])
    assert resolve(cfg, threads=3).hogbatch.cpu_threads == 2  # as train.threads


def test_parts_are_built_from_a_resolved_config_only():
    """The algorithms read the derived values as resolve set them, so building from a config
    that skipped resolve is refused, naming what is unset; a resolved one has nothing unset."""
    from hvd_adaptive.config import unresolved
    from hvd_adaptive.train.build import build_algorithm

    cfg, _ = load_config(None, ["hogbatch.gpu_batch=64"])
    assert unresolved(cfg) == ["train.threads", "adaptive.b_max", "hogbatch.cpu_threads",
                               "hogbatch.b_max", "hogbatch.round_epochs"]
    assert unresolved(resolve(cfg, threads=1)) == []
    with pytest.raises(ValueError, match=r"resolved config .*'train.threads', 'adaptive.b_max'"):
        build_algorithm(cfg, cluster=None, train=None)
