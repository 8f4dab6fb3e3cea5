"""Checkpoints of a run: atomic folders under `<run_dir>/checkpoints/`, resume from the newest.

With a validation split, `checkpoints/best/ckpt-<round>/` holds the model of the best
validation score so far (records.val_score), in the same layout, its arrays only
(Checkpointer.save_best).

Layout of one checkpoint, `ckpt-<round>/` (round = merge windows done):
  state.json, <key>.npy      state that is identical on every rank (written by rank 0)
  rank-<r>/state.json, ...   state that can differ between ranks (keys "rank.*"), one folder
                             per rank, each written by its own rank
  COMPLETE                   manifest: round, ranks, sha256 and size of every file; last
Everything is written into `.tmp-ckpt-<round>/`, fsynced, then renamed by rank 0, so a
`ckpt-*` folder only ever appears whole. A folder that fails verification (no COMPLETE,
checksum or size mismatch, unreadable array) is skipped in favour of the previous one.

State dicts are flat: str -> numpy array (stored as .npy) or JSON value (int, float, bool,
str, None, list, dict). Keys starting with "rank." are per-rank. Resuming on a different
number of ranks hands rank r the per-rank part of old rank r mod N; the algorithms resize
their per-rank arrays themselves (see Algorithm.load_state_dict).

A training checkpoint (Checkpointer.save_training) is the algorithm's state_dict plus the
training loop's position under "trainer.*" keys: round, the window stream's key, the length of
metrics.jsonl, and what the loop passes (wall, samples, totals, evals, last_progress).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from hvd_adaptive.config import WINDOW_MIN_BATCHES, ConfigError
from hvd_adaptive.train.periodic import itstime
from hvd_adaptive.train.records import val_score

FORMAT = 1
MARKER = "COMPLETE"
# Every key of a training checkpoint, by its prefix or name (an array "<prefix><i>" is the i-th
# of its list, in the model's or the optimizer's variable order):
MODEL = "model."          # the rank's replica (equal on every rank where no PER_RANK prefix)
OPT = "opt."              # the optimizer's slots; "opt.lr" its current rate
SMA_CENTRAL = "sma.central."    # SMA's central model, the one it evaluates
SMA_MOMENTUM = "sma.momentum."  # SMA's momentum of the central model
LOOP = "trainer."         # the training loop's position (Position.saved, the stream's key)
PER_RANK = "rank."        # before a key whose value differs between ranks (saved per rank)
_NAME = re.compile(r"^ckpt-(\d+)$")
_KEY = re.compile(r"^[A-Za-z0-9_.-]+$")


def indexed(prefix: str, arrays) -> dict:
    """{"<prefix><i>": array i}: a list of arrays as checkpoint entries."""
    return {f"{prefix}{i}": a for i, a in enumerate(arrays)}


def indexed_keys(state: dict, prefix: str) -> list[str]:
    """The keys "<prefix><i>" of `state`, in the order of i."""
    keys = [k for k in state if k.startswith(prefix) and k[len(prefix):].isdigit()]
    return sorted(keys, key=lambda k: int(k[len(prefix):]))
BEST = "best"  # checkpoints/best/: the model of the best validation score (Checkpointer.save_best)


class CheckpointError(ValueError):
    """A checkpoint is unusable or does not fit this run; the message names the folder."""


# ---- writing ---------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    # The rename is only durable once the parent folder's entry is on disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: bytes) -> dict:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _write_npy(path: Path, arr: np.ndarray) -> dict:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": _sha256(path), "bytes": path.stat().st_size}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _write_part(folder: Path, state: dict, prefix: str) -> dict:
    """Writes one flat state dict into `folder`; returns {path relative to the checkpoint: info}."""
    folder.mkdir(parents=True, exist_ok=True)
    files, scalars = {}, {}
    for key, value in state.items():
        if not _KEY.match(key):
            raise ValueError(f"checkpoint key {key!r}: only letters, digits, '_', '.', '-'")
        if isinstance(value, np.ndarray):
            files[prefix + key + ".npy"] = _write_npy(folder / (key + ".npy"), value)
        else:
            scalars[key] = value
    text = json.dumps(scalars, indent=1, default=_plain).encode()
    files[prefix + "state.json"] = _write_bytes(folder / "state.json", text)
    return files


def _plain(x: Any) -> Any:
    # numpy scalars (float32 losses, int64 counts) turn up in the loop's state.
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"cannot store {type(x).__name__} in a checkpoint")


def save(ckpt_dir: Path, step: int, state: dict, comm=None, keep: int = 3) -> Path:
    """Writes checkpoint `ckpt-<step>` atomically; collective when `comm` has several ranks.

    Args:
        ckpt_dir: The run's checkpoints folder (shared by all ranks).
        step: Rounds done; names the checkpoint.
        state: This rank's flat state dict. Keys starting with "rank." are written by every
            rank into its own `rank-<r>/`; the rest only by rank 0 (identical on all ranks).
        comm: mpi4py communicator, or None for a single process.
        keep: How many complete checkpoints to keep (older ones are deleted).

    Returns:
        The final folder `ckpt_dir/ckpt-<step>`.
    """
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    tmp, final = ckpt_dir / f".tmp-ckpt-{step}", ckpt_dir / f"ckpt-{step}"
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left over from a crash at the same round
        tmp.mkdir()
    if comm is not None:
        comm.Barrier()  # the folder exists before anyone writes into it
    local = {k[len(PER_RANK):]: v for k, v in state.items() if k.startswith(PER_RANK)}
    files = _write_part(tmp / f"rank-{rank}", local, f"rank-{rank}/")
    if rank == 0:
        shared = {k: v for k, v in state.items() if not k.startswith(PER_RANK)}
        files.update(_write_part(tmp, shared, ""))
    parts = comm.gather(files, root=0) if comm is not None else [files]
    if rank != 0:
        return final
    manifest = {"format": FORMAT, "round": step, "ranks": size, "time": time.time(),
                "files": {k: v for p in parts for k, v in p.items()}}
    for r in range(size):
        _fsync_dir(tmp / f"rank-{r}")
    _write_bytes(tmp / MARKER, json.dumps(manifest, indent=1).encode())
    _fsync_dir(tmp)
    if final.exists():  # a corrupted or older copy of the same round: replace it
        _remove(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_dir)
    prune(ckpt_dir, keep)
    return final


def _remove(path: Path) -> None:
    # Rename first so a crash halfway through deleting never leaves a ckpt-* that looks valid.
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(ckpt_dir: Path, keep: int) -> None:
    """Deletes all but the newest `keep` checkpoints that carry a COMPLETE marker."""
    # Temporary folders of saves that crashed (the current save's was renamed already).
    for p in ckpt_dir.glob(".tmp-ckpt-*"):
        shutil.rmtree(p, ignore_errors=True)
    found = sorted(_numbered(ckpt_dir), reverse=True)
    complete = [p for _, p in found if (p / MARKER).is_file()]
    if len(complete) <= keep:
        return
    oldest_kept = int(_NAME.match(complete[keep - 1].name).group(1))
    for step, p in found:
        if step < oldest_kept:
            _remove(p)


def _numbered(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    out = []
    for p in ckpt_dir.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return out


# ---- finding and reading ---------------------------------------------------------------------
def verify(path: Path) -> dict:
    """Checks a checkpoint folder against its manifest; returns the manifest.

    Raises:
        CheckpointError: Marker missing or unreadable, a file missing, or a size or checksum
            mismatch; the message says which.
    """
    try:
        manifest = json.loads((path / MARKER).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MARKER} marker (written halfway?)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable {MARKER} marker: {e}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {manifest.get('format')}, expected {FORMAT}")
    for rel, info in manifest["files"].items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{path}: {rel} is missing")
        if f.stat().st_size != info["bytes"] or _sha256(f) != info["sha256"]:
            raise CheckpointError(f"{path}: {rel} does not match its checksum (damaged)")
        if f.suffix == ".npy":
            _check_npy(f, path, rel)
    return manifest


def _check_npy(f: Path, path: Path, rel: str) -> None:
    """Header and length of an .npy file (cheap even for large arrays)."""
    try:
        with open(f, "rb") as fh:
            fmt = np.lib.format
            read = fmt.read_array_header_1_0 if fmt.read_magic(fh) == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(fh)
            need = fh.tell() + int(np.prod(shape)) * dtype.itemsize
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: {rel} is not a readable array: {e}") from None
    if f.stat().st_size != need:
        raise CheckpointError(f"{path}: {rel} holds {f.stat().st_size} bytes, its header says {need}")


def find_latest(ckpt_dir: Path, warn: Callable[[str], None] = print) -> tuple[Optional[Path], list[Path]]:
    """The newest checkpoint that verifies, and the newer ones skipped as damaged.

    Args:
        ckpt_dir: The run's checkpoints folder (may not exist).
        warn: Called with one line per skipped checkpoint.

    Returns:
        (path or None, skipped paths, newest first).
    """
    skipped = []
    for _, p in sorted(_numbered(ckpt_dir), reverse=True):
        try:
            verify(p)
            return p, skipped
        except CheckpointError as e:
            warn(f"warning: skipping checkpoint: {e}")
            skipped.append(p)
    return None, skipped


def newest(ckpt_dir: Path) -> Optional[Path]:
    """The highest-numbered checkpoint folder, not verified; None when there is none."""
    found = _numbered(ckpt_dir)
    return max(found)[1] if found else None


def _read_part(folder: Path, where: Path, mmap: bool = False) -> dict:
    try:
        state = json.loads((folder / "state.json").read_text())
        for f in sorted(folder.glob("*.npy")):
            state[f.name[:-4]] = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{where}: unreadable: {e}") from None
    return state


def load(path: Path, rank: int = 0, mmap: bool = False) -> tuple[dict, dict]:
    """Reads a checkpoint for one rank.

    Args:
        path: A checkpoint folder (normally from find_latest).
        rank: This rank; it receives the per-rank part of old rank `rank % ranks written`.
        mmap: Memory-map the arrays read-only instead of reading them (a reader that needs
            only the model then never loads the optimizer's slots).

    Returns:
        (state, manifest): the shared keys plus this rank's "rank.*" keys, and the manifest
        (with "round" and "ranks").
    """
    try:
        manifest = json.loads((path / MARKER).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable {MARKER} marker: {e}") from None
    state = _read_part(path, path, mmap)
    own = _read_part(path / f"rank-{rank % manifest['ranks']}", path, mmap)
    state.update({PER_RANK + k: v for k, v in own.items()})
    return state, manifest


def check_resumable(path, state: dict, algorithm: Optional[str], stream: list) -> None:
    """Whether this run can go on from a training checkpoint's state (its shared scalars).

    Args:
        path: The checkpoint folder, named in the message.
        state: At least the checkpoint's "algorithm" and "trainer.stream" entries.
        algorithm: This run's train.algorithm; None leaves it to Algorithm.load_state_dict.
        stream: This run's [train.seed, rows a window (TrainConfig.window_rows), training
            rows], and train.eval_every where rounds also end at evaluations (sync); a None
            (not known before MPI starts or the data is loaded) matches any value, and a
            shorter list checks only its part (before TensorFlow starts).

    Raises:
        ConfigError: Another algorithm or another window stream; the message names the folder.
    """
    if algorithm is not None and state.get("algorithm") != algorithm:
        raise ConfigError(f"{path}: checkpoint was written by train.algorithm={state.get('algorithm')}, "
                          f"this run uses {algorithm}")
    saved = state.get(LOOP + "stream")
    if saved is None or len(saved) < len(stream) or any(
            x is not None and x != y for x, y in zip(stream, saved)):
        known = list(saved or stream)
        shown = [known[i] if x is None and i < len(known) else x for i, x in enumerate(stream)]
        marks = ", train.eval_every" if len(stream) > 3 or len(saved or ()) > 3 else ""
        raise ConfigError(
            f"{path}: checkpoint was taken with [train.seed, rows a window, training rows{marks}] = "
            f"{saved}, this run has {shown} (rows a window: train.window_samples, at least "
            f"{WINDOW_MIN_BATCHES} batches of train.batch_size a rank); resume with the same "
            "values or use another --run-dir")


def check_before_start(run_dir, algorithm: str, stream: list) -> None:
    """--resume's refusals, before MPI and TensorFlow start (run.check_inputs).

    Reads only the shared scalars (state.json) of the newest checkpoint that has its marker;
    the arrays are checked against the manifest later, when the trainer restores (and skips a
    damaged newest one then: all checkpoints of a folder come from one run, so the one it
    picks was taken with the same settings). No checkpoint, or an unreadable one: nothing to
    refuse here.

    Raises:
        ConfigError: As check_resumable, naming the checkpoint.
    """
    for _, path in sorted(_numbered(Path(run_dir) / "checkpoints"), reverse=True):
        try:
            if not (path / MARKER).is_file():
                continue
            state = json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and "algorithm" in state:
            check_resumable(path, state, algorithm, stream)
        return


def quarantine(paths: list[Path]) -> None:
    """Renames damaged checkpoints to `damaged-ckpt-*` so they neither shadow nor get pruned."""
    for p in paths:
        with contextlib.suppress(OSError):
            os.rename(p, p.with_name(f"damaged-{p.name}-{int(time.time())}"))


def clear(ckpt_dir: Path) -> int:
    """Deletes every checkpoint (a fresh run in an old run folder); returns how many."""
    found = _numbered(ckpt_dir)
    for _, p in found:
        _remove(p)
    return len(found)


def all_finite(state: dict[str, Any]) -> bool:
    """Whether every floating-point array of a state dict is finite."""
    return all(np.isfinite(v).all() for v in state.values()
               if isinstance(v, np.ndarray) and v.dtype.kind == "f")


# ---- the trainer's view ----------------------------------------------------------------------
class Checkpointer:
    """A run's checkpoint policy; every method is collective (call on every rank).

    Rank 0 picks the checkpoint to resume from and tells the others, so all ranks restore the
    same one even if a file system shows them different views.
    """

    def __init__(self, run_dir: Path, cfg, comm, say: Callable[[str], None]):
        """
        Args:
            run_dir: The run folder, shared by all ranks.
            cfg: The `checkpoint` section (config.CheckpointConfig).
            comm: mpi4py communicator over all ranks.
            say: Prints a line on rank 0 (the others stay quiet).
        """
        self.dir = Path(run_dir) / "checkpoints"
        self.best_dir = self.dir / BEST
        self.cfg, self.comm, self.say = cfg, comm, say
        self.last_saved: Optional[int] = None

    def start(self) -> Optional[tuple[dict, dict]]:
        """Resume auto: (state, manifest) of the newest good checkpoint, else None (fresh run).

        Resume never: deletes checkpoints an earlier run left in this folder, so they can
        neither be mixed with this run's nor resumed by mistake later.
        """
        chosen = None
        if self.comm.Get_rank() == 0:
            if self.cfg.resume == "auto":
                path, skipped = find_latest(self.dir, self.say)
                quarantine(skipped)  # else a damaged newer round would outrank our next saves
                chosen = str(path) if path else None
                if path is None:
                    self.say(f"resume: no complete checkpoint in {self.dir}; starting from scratch")
            elif clear(self.dir):
                self.say(f"removed the checkpoints of an earlier run in {self.dir} "
                         "(checkpoint.resume is never)")
            if chosen is None and self.best_dir.is_dir():  # an earlier run's best model
                _remove(self.best_dir)
        chosen = self.comm.bcast(chosen, root=0)
        if chosen is None:
            return None
        state, manifest = load(Path(chosen), self.comm.Get_rank())
        self.last_saved, manifest["path"] = manifest["round"], chosen
        self.say(f"resuming from {chosen} (round {manifest['round']}, written by "
                 f"{manifest['ranks']} rank(s))")
        return state, manifest

    def due(self, rounds_done: int) -> bool:
        """Whether a periodic checkpoint (every checkpoint.every rounds) is due after this many."""
        return self.cfg.every is not None and itstime(rounds_done, self.cfg.every, rounds_done - 1)

    def final_due(self, rounds_done: int) -> bool:
        """Whether the run's end needs a checkpoint, so a longer run can continue from it:
        unless one was just written, or checkpoint.keep is 0 (none at all)."""
        return self.cfg.keep > 0 and self.last_saved != rounds_done

    def save(self, rounds_done: int, state: dict) -> Path:
        """Writes a checkpoint; refuses a model with NaN or inf (the last good one stays).

        Raises:
            FloatingPointError: Some rank's state holds non-finite values.
        """
        if any(self.comm.allgather(not all_finite(state))):
            last = f"ckpt-{self.last_saved}" if self.last_saved is not None else "none yet"
            raise FloatingPointError(
                f"the model has non-finite values (NaN or inf) after round {rounds_done}; no "
                f"checkpoint written (last good one: {last}); lower optim.lr or check the data")
        path = save(self.dir, rounds_done, state, self.comm, self.cfg.keep)
        self.last_saved = rounds_done
        return path

    # ---- the best model: its arrays only, in checkpoints/best/ckpt-<round> ----------------------
    def save_best(self, weights, rounds_done: int, record: dict, algorithm: str,
                  model: str = "trained") -> Path:
        """Keeps `weights` (the evaluated model's variables, or checkpoint.average's arrays in
        their order; equal on every rank) as the run's best, replacing the previous best once
        the new one is complete (collective; rank 0 writes).

        The folder holds the arrays as "model.<i>" (what runmodel.open_run reads) and the
        evaluation that chose them under "best.*" ("best.model": trained or average;
        "best.val_score": the validation score it was kept by, records.val_score; `record` is
        the evaluation as its kept model saw it, trainer.kept_view for the average)."""
        state = {}
        if self.comm.Get_rank() == 0:
            state = indexed(MODEL, [np.asarray(w) for w in weights])
            state.update({"best.of": algorithm, "best.model": model, "best.round": rounds_done,
                          "best.epoch": record["epoch"], "best.val_p_at_1": record["val_p_at_1"],
                          "best.val_score": val_score(record),
                          "best.p_at_1": record["p_at_1"]})
        return save(self.best_dir, rounds_done, state, self.comm, keep=1)

    def best_value(self) -> float:
        """The validation score of the kept best model (-1 when there is none, or where it was
        kept by another figure); rank 0 reads."""
        value = -1.0
        if self.comm.Get_rank() == 0:
            path = newest(self.best_dir)
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                value = float(json.loads((path / "state.json").read_text())["best.val_score"])
        return self.comm.bcast(value, root=0)

    # ---- training checkpoints: an algorithm plus the loop's position -------------------------
    @staticmethod
    def stream_key(algo) -> list:
        """What the window stream depends on: resuming skips windows, so these must not change."""
        train = algo.cfg.train
        key = [train.seed, train.window_rows(algo.ctx.cluster.size), algo.ctx.train.n_rows]
        return key + [train.eval_every] if algo.rounds_end_at_evaluations else key

    def restore(self, algo, log) -> Optional[dict]:
        """Loads the newest good checkpoint into the algorithm (resume auto).

        Args:
            algo: The run's Algorithm, set up on every rank.
            log: The RunLog; metrics.jsonl is cut back to where the checkpoint was taken.

        Returns:
            The loop's saved state (the "trainer.*" keys without the prefix), or None for a
            fresh run.

        Raises:
            ConfigError: The checkpoint was taken with another window stream, algorithm or model.
        """
        found = self.start()
        if found is None:
            return None
        state, manifest = found
        check_resumable(manifest["path"], state, None, self.stream_key(algo))
        try:
            algo.load_state_dict(state)
        except ValueError as e:  # wrong algorithm or model shape: say which checkpoint
            raise ConfigError(f"{manifest['path']}: {e}") from None
        if algo.resized:
            n = manifest["ranks"]
            own = ("" if not (algo.optimizer_differs_by_rank or algo.model_differs_by_rank) else
                   f"; rank r takes the per-rank state (optimizer, sma replica) of old rank r mod {n}")
            self.say(f"warning: checkpoint written by {n} ranks, resuming on {algo.cluster.size}: "
                     f"per-rank batch sizes, shares and totals restart{own}")
        log.truncate(int(state[LOOP + "metrics_bytes"]))
        return {k[len(LOOP):]: v for k, v in state.items() if k.startswith(LOOP)}

    def save_training(self, algo, log, rounds_done: int, loop_state: dict) -> Path:
        """Checkpoints the algorithm and the loop's position (every rank); rank 0 says where.

        Args:
            algo: The run's Algorithm, at the end of a round.
            log: The RunLog; rank 0's length of metrics.jsonl is saved, to cut back to on resume.
            rounds_done: Rounds trained; names the checkpoint.
            loop_state: The loop's own state, saved under "trainer.<key>".
        """
        state = algo.state_dict()
        state.update({LOOP + k: v for k, v in loop_state.items()})
        state[LOOP + "round"] = rounds_done
        state[LOOP + "stream"] = self.stream_key(algo)
        state[LOOP + "metrics_bytes"] = log.size()  # rank 0's count is the one saved
        path = self.save(rounds_done, state)
        self.say(f"checkpoint {path}")
        return path
