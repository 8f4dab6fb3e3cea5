"""Run under mpirun: the plain Horovod script's step (hvd_adaptive/bench/plain_horovod.py) does the
project's maths: from the same initial weights, on the same global batches, its steps and the
project's `sync` steps leave the same weights and optimizer state.

Usage: mpirun -np 2 python tests/mpi/ranks/horovod_reference_ranks.py CASE [CASE ...]
  CASE: OPTIMIZER[:deep|:acc|:smooth|:timed|:sampled|:linear] (sgd, momentum, adagrad,
  rowwise_adagrad; `deep`: two hidden layers, so a dense hidden kernel sits between the
  row-sparse input layer and the output layer; `acc`: accumulators starting at
  optim.initial_accumulator 0.1; `smooth`: label smoothing; `timed`: sync's timed step instead
  of its fused one; `sampled`: the sampled loss; `linear`: no hidden layer and the sigmoid
  loss); the cases run one after another in the same ranks.

Per case both are built on the tiny config: the project's Sync algorithm (as the trainer builds
it, broadcast and traced) and the plain script's model, optimizer and tf.function step. The
plain model must come out of its own initialisation equal to the project's (same scheme, same
seed); it is then loaded with the project's weights anyway, so the steps start from the same
point whatever the initialisation. STEPS global batches of ranks x batch_size rows are taken
from a shuffle; each rank trains its equal slice with both (sync's share-weighted Sum over
ranks, the plain script's DistributedGradientTape Average). Every step's local loss must agree,
and in the end every variable and optimizer slot, within float tolerance. Before anything else
the program checks that importing the plain script pulled in none of the project's training
modules. Exit code 0 means every check held.
"""
import sys

import numpy as np

from hvd_adaptive.bench import plain_horovod  # first: what it imports is checked right below

# The plain script is the yardstick only if it shares none of the project's training path.
TRAINING_PATH = ("train.trainer", "train.algorithms", "train.evaluation", "model.network",
                 "parallel.merge", "train.balance", "parallel.distributed")
_pulled = [m for m in TRAINING_PATH if f"hvd_adaptive.{m}" in sys.modules]
assert not _pulled, f"importing hvd_adaptive.bench.plain_horovod imported hvd_adaptive.{_pulled}"

from tests.harness.cases import each_case  # noqa: E402
import tensorflow as tf  # noqa: E402

STEPS = 8


def check_sampled(case: str, cfg, c, train, algo, plain) -> None:
    """The sampled loss: on the candidates the project draws, the plain script's loss and every
    gradient equal the project's; the plain script draws its own candidates, the batch's labels
    first, then drawn labels that are not among them (by label frequency), corrected by the log
    of their expected counts (none for the batch's), and from the same stream of draws they are
    the project's; its Horovod step trains on them."""
    model = algo.model
    rows = np.arange(c.rank * 8, c.rank * 8 + 8)  # few: the step must leave some output rows alone
    ids, vals, seg, labels, label_row, n = plain_horovod.batch(train, rows)
    pb = algo.batch(rows)  # the project's tensors of the same rows
    cand, corr, pos = model.candidates(pb[3])
    with tf.GradientTape(persistent=True) as tape:
        ours = model.candidate_loss(pb[0], pb[1], pb[2], cand, corr, pos, pb[4], pb[5], pb[6])
        theirs = plain.net.candidate_xent(ids, vals, seg, cand, corr, pos, label_row, n)
    np.testing.assert_allclose(float(theirs), float(ours), rtol=1e-5)
    for i, (a, b) in enumerate(zip(algo.variables, plain.net.ordered)):
        ga, gb = (tf.convert_to_tensor(g) for g in (tape.gradient(ours, a), tape.gradient(theirs, b)))
        np.testing.assert_allclose(gb.numpy(), ga.numpy(), rtol=1e-4, atol=1e-7,
                                   err_msg=f"variable {i}: the sampled loss's gradient differs")
    own = np.unique(labels)
    for drawer in (model.negatives, plain.net.drawer):  # the same stream: the same draws
        drawer.restart(5)
    same = [[t.numpy() for t in m.candidates(labels)] for m in (model, plain.net)]
    for a, b in zip(*same):
        np.testing.assert_array_equal(a, b, err_msg="the plain script drew other candidates")
    mine, mcorr, where = (t.numpy() for t in plain.net.candidates(labels))
    assert sorted(mine[:len(own)]) == sorted(own) and (mine[where] == labels).all()
    assert len(set(mine)) == len(mine) and len(own) < len(mine) <= len(own) + cfg.model.negatives
    assert (mcorr[:len(own)] == 0).all() and np.isfinite(mcorr).all() and (mcorr[len(own):] < 0).all()
    # negatives by frequency (the case's model.sampler): beside a batch of the rarest label
    # alone, the drawn labels are the more frequent (on the tiny data, mean frequency 1.78x the
    # labels' mean by frequency, 1.04x drawn uniformly)
    freq = train.label_frequencies()
    rarest = np.array([int(np.argmin(freq))])
    drawn = np.concatenate([plain.net.candidates(rarest)[0].numpy()[1:] for _ in range(100)])
    assert freq[drawn].mean() > 1.4 * freq.mean(), (freq[drawn].mean(), freq.mean())
    # row-wise Adagrad keeps one value a row of the sampled output layer, as the project does
    assert [s.shape.as_list() for s in plain.opt.slots] == [s[0].shape.as_list() for s in algo.opt.slots]
    before = plain.net.kernels[-1].numpy()
    loss = float(plain.step(ids, vals, seg, labels, label_row, n))
    moved = np.abs(plain.net.kernels[-1].numpy() - before).max(axis=1) > 0
    assert np.isfinite(loss) and 0 < moved.sum() < train.n_labels, (loss, moved.sum())
    if c.is_root:
        print(f"horovod reference ok ({case}): loss {float(ours):.4f} on {len(cand)} candidates, "
              f"the plain step moved {moved.sum()} of {train.n_labels} output rows", flush=True)


def check(case: str, c) -> None:
    optimizer, _, shape = case.partition(":")
    # Adagrad's first step on a row is lr x sign(g): eps 0.01 damps the steps of gradients of
    # float-noise size, whose sign the two computations' summation orders would decide.
    opt_sets = {"sgd": ["optim.lr=0.5"], "momentum": ["optim.lr=0.1"],
                "adagrad": ["optim.lr=0.1", "optim.eps=0.01"],
                "rowwise_adagrad": ["optim.lr=0.1", "optim.eps=0.01"]}[optimizer]
    from hvd_adaptive.config import load_config

    cfg, _ = load_config("configs/tiny.yaml", [
        "train.algorithm=sync", f"optim.name={optimizer}", *opt_sets,
        *(["model.hidden=[48, 32]"] if shape == "deep" else []),
        *(["optim.initial_accumulator=0.1"] if shape == "acc" else []),
        *(["model.label_smoothing=0.1"] if shape == "smooth" else []),
        *(["sync.step=timed"] if shape == "timed" else []),
        *(["model.hidden=[]", "model.loss=sigmoid"] if shape == "linear" else []),
        *(["model.output=sampled", "model.negatives=20", "model.sampler=frequency"]
          if shape == "sampled" else [])])
    from hvd_adaptive.train.algorithms.base import RoundStats
    from hvd_adaptive.data import epoch_permutation, load_data
    from tests.harness.real_algorithm import build

    train, _ = load_data(cfg, c.is_root, c.comm.Barrier)
    algo = build(cfg, c, train)  # Sync, set up (rank 0's weights broadcast) and traced
    assert algo.fused == (shape != "timed"), (case, algo.fused)
    plain = plain_horovod.PlainHorovod(cfg, train.n_features, train.n_labels, train.label_frequencies())
    project = algo.variables
    assert len(project) == len(plain.net.ordered), (len(project), len(plain.net.ordered))
    for i, (a, b) in enumerate(zip(project, plain.net.ordered)):
        np.testing.assert_array_equal(b.numpy(), a.numpy(),
                                      err_msg=f"variable {i}: initialisation differs from the project's")
        b.assign(a)  # load: the same start whatever the initialisation
    for i, (slots, s) in enumerate(zip(algo.opt.slots, plain.opt.slots)):  # the optimizer's too
        np.testing.assert_array_equal(s.numpy(), slots[0].numpy(),
                                      err_msg=f"optimizer state of variable {i} starts elsewhere")
    start = [v.numpy() for v in project]
    # Rows without features, the last two among them, come out of both input layers as the bias.
    empty = (tf.constant([3, 7, 5], tf.int64), tf.constant([1.0, 2.0, 0.5]), tf.constant([0, 0, 2], tf.int32),
             tf.constant(5, tf.int32))
    ours, theirs = algo.model.hidden(*empty).numpy(), plain.net.hidden(*empty).numpy()
    assert theirs.shape == ours.shape == (5, ours.shape[1]), (theirs.shape, ours.shape)
    np.testing.assert_allclose(theirs, ours, rtol=1e-6, atol=1e-7)
    if shape == "sampled":
        return check_sampled(case, cfg, c, train, algo, plain)
    with plain.unchanged():  # trace the plain step (collective: every rank) without effects
        plain.step(*plain_horovod.batch(train, np.arange(8)))

    perm = epoch_permutation(train.n_rows, 123, 0)
    size = cfg.train.batch_size * c.size
    losses = []
    for s in range(STEPS):
        mine = np.array_split(perm[s * size:(s + 1) * size], c.size)[c.rank]
        stats = RoundStats(epoch=0.0, batch_size=cfg.train.batch_size)
        algo.step(mine, 1.0 / c.size, stats)  # the project's sync step on the same rows
        loss = float(plain.step(*plain_horovod.batch(train, mine)))
        losses.append((stats.loss_sum / stats.samples, loss))
    np.testing.assert_allclose([b for _, b in losses], [a for a, _ in losses], rtol=1e-5,
                               err_msg="a step's local loss differs from sync's")
    worst = 0.0
    for i, (a, b) in enumerate(zip(project, plain.net.ordered)):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"variable {i} differs from sync's after {STEPS} steps")
        worst = max(worst, float(np.abs(b.numpy() - a.numpy()).max()))
    moved = max(float(np.abs(a.numpy() - s0).max()) for a, s0 in zip(project, start))
    assert moved > 1e-3, f"the steps hardly moved the weights ({moved}): nothing was compared"
    if optimizer != "sgd":
        for i, (slots, s) in enumerate(zip(algo.opt.slots, plain.opt.slots)):
            np.testing.assert_allclose(s.numpy(), slots[0].numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"optimizer state of variable {i} differs from sync's")
    if c.is_root:
        print(f"horovod reference ok ({case}): {STEPS} steps, losses {losses[0][1]:.4f} -> "
              f"{losses[-1][1]:.4f}, weights moved up to {moved:.3g}, largest difference "
              f"{worst:.2g}", flush=True)


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(each_case(check))
