"""Grid sweeps: a config's `sweep:` section expands into numbered points, one run each.

Usage:
  hvd-adaptive sweep list configs/sweep_tiny.yaml            # "<index>\\t<name>" per point
  hvd-adaptive sweep list configs/sweep_tiny.yaml --count    # just the number of points
  mpirun -np 2 hvd-adaptive sweep run configs/sweep_tiny.yaml --index 1 --root runs/sweep
  sbatch --array=0-1 --ntasks=2 slurm/sweep.sbatch configs/sweep_tiny.yaml   # index from Slurm

The section (every other key of the file is the base config shared by all points):

  sweep:
    grid:                        # cartesian product over dotted config keys
      train.algorithm: [sync, adaptive]
      optim.lr: [0.05, 0.1]
    seeds: [0, 1]                # optional: sets train.seed (default: the config's seed only)

Point i trains into <root>/<config stem>/<name>, where the name spells out the point's values
(`train.algorithm=sync,optim.lr=0.05,seed=0`). Every point's config is built and validated
(run.check_inputs included) before anything starts, so a typo in the grid fails in the login
shell, not in array element 7.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hvd_adaptive.config import Config, ConfigError, load_config
from hvd_adaptive.data import DataError
from hvd_adaptive.train.run import check_inputs

_SWEEP_KEYS = ("grid", "seeds")
# Longest folder name we produce; most filesystems allow 255 bytes per path component.
_MAX_NAME = 200


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: its position, folder name, and the overrides that make it."""

    index: int
    name: str
    overrides: tuple[str, ...]
    """`section.key=value` strings (values as JSON, which YAML reads back unchanged)."""
    config: Config


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "-".join(_format_value(v) for v in value)
    if isinstance(value, dict):
        return "-".join(f"{k}_{_format_value(v)}" for k, v in value.items())
    return "null" if value is None else str(value)


def point_name(items: list[tuple[str, Any]]) -> str:
    """Folder-safe name of a point: `key=value` pairs joined by commas.

    Characters other than letters, digits and `._=,+-` become `_` (a value may be a path);
    names longer than about 200 characters are cut and made unique with a short hash.

    Args:
        items: (dotted key or "seed", value) pairs in grid order.
    """
    text = ",".join(f"{k}={_format_value(v)}" for k, v in items)
    name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)
    if name.startswith("."):  # keep the folder visible to ls and to shell globs
        name = "_" + name[1:]
    if len(name) > _MAX_NAME:
        digest = hashlib.sha1(text.encode()).hexdigest()[:10]
        name = f"{name[:_MAX_NAME - 11]}-{digest}"
    return name


def parse_section(section: Any, where: str = "sweep") -> tuple[list[tuple[str, list]], Optional[list[int]]]:
    """Checks a raw `sweep:` section's shape.

    Args:
        section: the section as YAML gave it.
        where: prefix for error messages (e.g. the config file and "sweep").

    Returns:
        (grid, seeds): grid as (dotted key, values) pairs in file order; seeds or None.

    Raises:
        ConfigError: naming the offending key.
    """
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping with 'grid' (and optionally 'seeds'), "
                          f"got {section!r}")
    for key in section:
        if key not in _SWEEP_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (known: {list(_SWEEP_KEYS)})")
    grid_raw = section.get("grid")
    if not isinstance(grid_raw, dict) or not grid_raw:
        raise ConfigError(f"{where}.grid: needs at least one `section.key: [values...]` entry, "
                          f"got {grid_raw!r}")
    grid = []
    for key, values in grid_raw.items():
        path = f"{where}.grid.{key}"
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{path}: keys must be dotted config paths such as optim.lr")
        if key.split(".")[0] == "sweep":
            raise ConfigError(f"{path}: a sweep cannot vary its own section")
        if not isinstance(values, list):
            raise ConfigError(f"{path}: expected a list of values, got {values!r}")
        if not values:
            raise ConfigError(f"{path}: empty list of values (a sweep needs at least one)")
        grid.append((key, values))
    seeds = section.get("seeds")
    if seeds is not None:
        if (not isinstance(seeds, list) or not seeds
                or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)):
            raise ConfigError(f"{where}.seeds: expected a non-empty list of integers, got {seeds!r}")
        if "train.seed" in grid_raw:
            raise ConfigError(f"{where}.seeds: train.seed is also in the grid; keep one of them")
    return grid, seeds


def expand(config: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> list[SweepPoint]:
    """Every point of the sweep in CONFIG, each with its config built and validated.

    Args:
        config: YAML file with a `sweep:` section.
        overrides: `--set` strings applied to every point (they may not touch swept keys).

    Raises:
        ConfigError: a bad section, a `--set` of a swept key, a point whose config is invalid
            (the message names the point and the key), or two points with one folder name.
    """
    _, extras = load_config(config, overrides, extra_sections=("sweep",))
    if "sweep" not in extras:
        raise ConfigError(f"{config}: no sweep: section (see `hvd-adaptive sweep --help`)")
    grid, seeds = parse_section(extras["sweep"], f"{config}: sweep")
    swept = {k for k, _ in grid} | ({"train.seed"} if seeds else set())
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in swept:
            raise ConfigError(f"--set {key}: the sweep in {config} varies this key")
    keys = [k for k, _ in grid]
    combos = itertools.product(*(v for _, v in grid), *([seeds] if seeds else []))
    points: list[SweepPoint] = []
    seen: dict[str, int] = {}
    for index, values in enumerate(combos):
        pairs = list(zip(keys, values[:len(keys)]))
        named = pairs + ([("seed", values[-1])] if seeds else [])
        name = point_name(named)
        if name in seen:
            raise ConfigError(f"{config}: sweep points {seen[name]} and {index} share the folder "
                              f"name {name!r}; remove repeated values from the grid")
        seen[name] = index
        sets = [f"{k}={json.dumps(v)}" for k, v in pairs]
        if seeds:
            sets.append(f"train.seed={values[-1]}")
        try:
            cfg, _ = load_config(config, [*overrides, *sets], extra_sections=("sweep",))
            check_inputs(cfg)
        except (ConfigError, DataError) as e:
            raise ConfigError(f"sweep point {index} ({name}): {e}") from None
        points.append(SweepPoint(index, name, tuple(sets), cfg))
    return points


def resolve_index(index: Optional[int], n_points: int, config: str | Path) -> int:
    """The point to run: --index, else SLURM_ARRAY_TASK_ID; checked against the sweep's size."""
    if index is None:
        env = os.environ.get("SLURM_ARRAY_TASK_ID")
        if env is None:
            raise ConfigError("sweep run: no --index and no SLURM_ARRAY_TASK_ID "
                              "(give --index N, or submit as a Slurm array job)")
        try:
            index = int(env)
        except ValueError:
            raise ConfigError(f"SLURM_ARRAY_TASK_ID={env!r} is not an integer") from None
    if not 0 <= index < n_points:
        raise ConfigError(f"sweep index {index} out of range: {config} has {n_points} point(s), "
                          f"valid indices are 0-{n_points - 1}")
    return index


def run_dir_for(root: str | Path, config: str | Path, point: SweepPoint) -> Path:
    """`<root>/<config stem>/<point name>`: one folder per point, sweeps kept apart by config."""
    return Path(root) / Path(config).stem / point.name


def main(args: argparse.Namespace) -> int:
    """Entry point of `hvd-adaptive sweep list|run` (parsed in hvd_adaptive.cli)."""
    points = expand(args.config, getattr(args, "set", []) or [])
    if args.sweep_command == "list":
        if args.count:
            print(len(points))
        else:
            for p in points:
                print(f"{p.index}\t{p.name}")
        return 0
    point = points[resolve_index(args.index, len(points), args.config)]
    run_dir = run_dir_for(args.root, args.config, point)
    # Every rank gets here with the same point (same file, same index); MPI starts only now,
    # after the whole sweep was checked.
    if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        # One write, so launchers that tag output per chunk keep the line whole.
        print(f"sweep point {point.index} of {len(points)}: {point.name} -> {run_dir}\n", end="",
              flush=True)
    from hvd_adaptive.train.run import run_training

    return run_training(point.config, str(run_dir), verbose=getattr(args, "verbose", False))
