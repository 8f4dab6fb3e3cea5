"""hvd-adaptive: command-line entry point.

Usage:
  horovodrun -np 2 -H localhost:2 hvd-adaptive train --config configs/default.yaml
  mpirun -np 2 hvd-adaptive train --config FILE --set train.algorithm=adaptive --run-dir runs/x
  mpirun -np 2 hvd-adaptive train --config FILE --run-dir runs/x --resume   # after a failure
  hvd-adaptive train ...                 # without a launcher: one rank
  mpirun -np 2 hvd-adaptive tune --config FILE    # the rate optim.lr=auto chooses, no training
  hvd-adaptive data synth --preset amazon670k --scale 0.01 --out data/amz
  hvd-adaptive data pypi --out data/pypi --projects 80000   # real data: PyPI projects' metadata
  hvd-adaptive data npm --out data/npm --packages 30000     # real data: npm packages' manifests
  hvd-adaptive trees --config FILE       # napkinXC's label tree on the same rows, for comparison
                                         #   (--method br: a logistic model a label, no tree)
  hvd-adaptive report runs/a runs/b --out report.png
  hvd-adaptive sweep list CONFIG | hvd-adaptive sweep run CONFIG --index N
  hvd-adaptive predict RUN_DIR --data FILE --out FILE [--k 5] [--checkpoint best|last|ckpt-N]
  mpirun -np 2 hvd-adaptive predict RUN_DIR --data FILE --out FILE   # rows split over ranks
  hvd-adaptive evaluate RUN_DIR --data FILE [--out FILE.json]       # P@k, nDCG@k, PSP@k, PSnDCG@k
  hvd-adaptive export RUN_DIR --out DIR [--k 5]                     # TensorFlow SavedModel
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

VERBOSE_HELP = "show TensorFlow's and absl's start-up messages on every rank (hidden by default)"


def _train(args: argparse.Namespace) -> int:
    from hvd_adaptive.config import ConfigError, load_config
    from hvd_adaptive.train.run import run_training

    if args.resume and not args.run_dir:
        raise ConfigError("--resume needs --run-dir: the folder of the run to continue")
    sets = [*args.set, "checkpoint.resume=auto"] if args.resume else args.set
    cfg, _ = load_config(args.config, sets, extra_sections=("sweep",))
    return run_training(cfg, args.run_dir, verbose=args.verbose)


def _tune(args: argparse.Namespace) -> int:
    from hvd_adaptive.config import load_config
    from hvd_adaptive.train.run import run_training

    cfg, _ = load_config(args.config, [*args.set, "optim.lr=auto", "checkpoint.keep=0"],
                         extra_sections=("sweep",))
    return run_training(cfg, args.run_dir, verbose=args.verbose, choose_only=True)


def _trees(args: argparse.Namespace) -> int:
    import json

    from hvd_adaptive.config import load_config
    from hvd_adaptive.bench.trees import run_napkinxc

    cfg, _ = load_config(args.config, args.set, extra_sections=("sweep",))
    out = run_napkinxc(cfg, threads=args.threads, method=args.method)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from hvd_adaptive.config import ConfigError
    from hvd_adaptive.data import preset, synth_to_files

    overrides = {k: v for k, v in (("n_train", args.n_train), ("n_test", args.n_test),
                                   ("n_features", args.n_features), ("n_labels", args.n_labels))
                 if v is not None}
    if not 0 <= args.label_noise <= 1:
        raise ConfigError(f"--label-noise {args.label_noise}: must be in [0, 1]")
    if args.rare_features < 0:
        raise ConfigError(f"--rare-features {args.rare_features}: must be >= 0")
    spec = preset(args.preset, scale=args.scale, seed=args.seed, label_noise=args.label_noise,
                  rare_features=args.rare_features, **overrides)
    t0 = time.perf_counter()
    print(f"writing {spec.n_train} train and {spec.n_test} test rows, {spec.n_features} features, "
          f"{spec.n_labels} labels to {args.out} ...", flush=True)
    if args.counts is not None and args.counts <= 0:
        raise ConfigError(f"--counts {args.counts}: must be > 0")
    train, test = synth_to_files(spec, Path(args.out), counts=args.counts)
    print(f"wrote {train} and {test} in {time.perf_counter() - t0:.1f} s")
    return 0


def _report(args: argparse.Namespace) -> int:
    from hvd_adaptive.bench.report import main as report_main

    return report_main(args)


def _sweep(args: argparse.Namespace) -> int:
    from hvd_adaptive.bench.sweep import main as sweep_main

    return sweep_main(args)


def _open_run(args: argparse.Namespace):
    """The run's verified checkpoint and the inputs' checks, all before TensorFlow starts."""
    from hvd_adaptive.config import ConfigError
    from hvd_adaptive.train.run import quiet_tensorflow
    from hvd_adaptive.serve.runmodel import open_run

    run = open_run(args.run_dir, args.checkpoint)
    if getattr(args, "k", None) is not None:
        run.check_k(args.k)
    data = getattr(args, "data", None)
    if data is not None and not Path(data).is_file():
        raise ConfigError(f"{data}: data file not found (--data)")
    if getattr(args, "batch_rows", 1) < 1:
        raise ConfigError(f"--batch-rows {args.batch_rows}: must be at least 1")
    quiet_tensorflow(args.verbose)
    return run


def _predict(args: argparse.Namespace) -> int:
    run = _open_run(args)
    from hvd_adaptive.serve.predict import predict

    predict(run, args.data, args.out, args.k, args.batch_rows, args.progress_every)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    run = _open_run(args)
    from hvd_adaptive.serve.predict import evaluate

    evaluate(run, args.data, args.out, args.rows)
    return 0


def _export(args: argparse.Namespace) -> int:
    from hvd_adaptive.config import ConfigError

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty folder; export into a new one")
    run = _open_run(args)
    from hvd_adaptive.serve.export import export

    print(f"exported {run.path} (top {args.k} of {run.n_labels} labels) to {export(run, args.out, args.k)}")
    return 0


def config_args(q: argparse.ArgumentParser) -> None:
    """--config and --set, as every command that reads a config takes them."""
    q.add_argument("--config", help="YAML config (default: built-in defaults, synthetic data)")
    q.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable; value parsed as YAML)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvd-adaptive", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one configuration (under horovodrun/mpirun/srun)")
    config_args(t)
    t.add_argument("--run-dir", help="output folder (default runs/<algorithm>-<time>)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the run folder's newest complete checkpoint, if any "
                        "(same as --set checkpoint.resume=auto)")
    t.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    t.set_defaults(fn=_train)

    u = sub.add_parser("tune", help="print the learning rate optim.lr=auto chooses for a config, "
                       "without training (under the same launcher and ranks as the training)")
    config_args(u)
    u.add_argument("--run-dir", help="folder for the choice's config.json and start record "
                   "(default runs/<algorithm>-<time>)")
    u.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    u.set_defaults(fn=_tune)

    e = sub.add_parser("trees", help="train napkinXC's label tree (PLT) on a config's data, "
                       "as the network does, and print its time and test P@k (one process)")
    config_args(e)
    e.add_argument("--threads", type=int, help="napkinXC's threads (default: every core)")
    e.add_argument("--method", choices=("plt", "br"), default="plt",
                   help="plt: the label tree (default); br: binary relevance, one logistic model "
                        "a label, no tree (slower to fit, ahead of the tree on the real text measured)")
    e.add_argument("--out", help="JSON file for the result")
    e.set_defaults(fn=_trees)

    d = sub.add_parser("data", help="data utilities")
    dsub = d.add_subparsers(dest="data_command", required=True)
    s = dsub.add_parser("synth", help="write a synthetic XC train/test pair")
    s.add_argument("--preset", default="amazon670k", help="amazon670k, delicious200k or eurlex4k")
    s.add_argument("--scale", type=float, default=0.01, help="multiplies rows and labels")
    s.add_argument("--seed", type=int, default=0)
    for k in ("n_train", "n_test", "n_features", "n_labels"):
        s.add_argument("--" + k.replace("_", "-"), dest=k, type=int)
    s.add_argument("--counts", type=float, metavar="PER_UNIT",
                   help="raw-count-like values: each L2-normalized TF-IDF value times PER_UNIT, "
                        "rounded, at least 1 (rows no longer normalized)")
    s.add_argument("--label-noise", type=float, default=0.0, metavar="FRACTION",
                   help="rows whose labels come from a random topic, not their features' "
                        "(data.synth.label_noise)")
    s.add_argument("--rare-features", type=float, default=0.0, metavar="FACTOR",
                   help="each row also gets FACTOR times its non-zeros of features drawn "
                        "uniformly, each in a few rows (data.synth.rare_features)")
    s.add_argument("--out", required=True, help="folder for train.txt and test.txt")
    s.set_defaults(fn=_synth)
    from hvd_adaptive.data.pypi import add_arguments as pypi_arguments

    y = dsub.add_parser("pypi", help="fetch (cached) PyPI projects' metadata and write a real "
                        "XC train/test pair: words as features, keywords and classifiers as labels")
    pypi_arguments(y)
    from hvd_adaptive.data.npm import add_arguments as npm_arguments

    m = dsub.add_parser("npm", help="crawl (cached) npm packages' manifests and write a real XC "
                        "train/test pair: words as features, keywords as labels")
    npm_arguments(m)

    r = sub.add_parser("report", help="plot P@1 against wall time from run folders")
    r.add_argument("runs", nargs="*", help="run folders (each with metrics.jsonl)")
    r.add_argument("--out", default="report.png", help="figure file (PNG)")
    r.add_argument("--target", type=float, help="P@1 target for the time-to-target column")
    r.add_argument("--scaling", metavar="JSON", help="instead of run folders: the scalability "
                   "figure from the scaling benchmark's scaling.json (hvd_adaptive/bench/scaling.py)")
    r.set_defaults(fn=_report)

    w = sub.add_parser("sweep", help="grid sweeps from a config's sweep: section")
    wsub = w.add_subparsers(dest="sweep_command", required=True)
    wl = wsub.add_parser("list", help="print the sweep's points with their index")
    wl.add_argument("config")
    wl.add_argument("--count", action="store_true", help="print only the number of points")
    wr = wsub.add_parser("run", help="run one point (index defaults to SLURM_ARRAY_TASK_ID)")
    wr.add_argument("config")
    wr.add_argument("--index", type=int)
    wr.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    wr.add_argument("--root", default="runs/sweep", help="parent folder of the points' run folders")
    wr.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    w.set_defaults(fn=_sweep)

    def run_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("run_dir", metavar="RUN_DIR", help="a training run's folder")
        q.add_argument("--checkpoint", metavar="best|last|ckpt-N",
                       help="which model: best (the best validation score, kept with "
                            "data.validation), last (the newest checkpoint) or a folder name; "
                            "default: best if the run kept one, else last; must verify")
        q.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)

    pr = sub.add_parser("predict", help="top-k labels and scores of rows, with a trained model")
    run_args(pr)
    pr.add_argument("--data", required=True, help="rows, XC or LIBSVM (labels ignored)")
    pr.add_argument("--out", required=True, help="output: one line a row, 'label:score' best first")
    pr.add_argument("--k", type=int, default=5, help="labels per row (default 5)")
    pr.add_argument("--batch-rows", type=int, default=2048, help="rows scored at once")
    pr.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS",
                    help="seconds between progress lines on stderr (default 10)")
    pr.set_defaults(fn=_predict)

    ev = sub.add_parser("evaluate", help="P@k, nDCG@k, PSP@k, PSnDCG@k of a trained model")
    run_args(ev)
    ev.add_argument("--data", required=True, help="labelled rows, XC or LIBSVM")
    ev.add_argument("--out", help="also write the result as JSON")
    ev.add_argument("--rows", type=int, help="only the first ROWS rows (like train.eval_rows)")
    ev.set_defaults(fn=_evaluate)

    ex = sub.add_parser("export", help="a TensorFlow SavedModel serving top-k labels")
    run_args(ex)
    ex.add_argument("--out", required=True, help="new folder for the SavedModel")
    ex.add_argument("--k", type=int, default=5, help="labels a row the signature returns")
    ex.set_defaults(fn=_export)
    return p


def main(argv: list[str] | None = None) -> int:
    from hvd_adaptive.config import ConfigError
    from hvd_adaptive.data import DataError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, DataError, FileNotFoundError, ValueError, FloatingPointError) as e:
        print(f"hvd-adaptive: error: {e}", file=sys.stderr)
        return 2


def entry() -> None:
    """The `hvd-adaptive` command: main, then a quick exit (distributed.exit_process)."""
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())


if __name__ == "__main__":
    entry()
