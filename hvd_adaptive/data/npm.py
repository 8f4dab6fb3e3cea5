"""A second real XMC data set: npm packages' metadata, words of a package's name and
description as features, its keywords as labels.

The npm registry has no list of every package, so :func:`fetch` crawls: it fetches the latest
version's manifest (``<registry>/<name>/latest``) of a fixed list of well-known packages
(:data:`SEEDS`), then of every package those depend on (``dependencies``,
``devDependencies``, ``peerDependencies``, ``optionalDependencies``), level by level in name
order within a level, until ``n_packages`` names are taken or no new name is left (28,961
names on 2026-11-28, in 26 levels). The sample is the packages that others build with, not a
uniform draw of the registry. Of each package it keeps ``name``,
``description`` (as ``summary``, the first 4,000 characters), ``keywords`` and the names it
depends on (``deps``, which the next level reads) as one JSON line of
``out_dir/records.jsonl``, appended as results arrive, in the records format of
:mod:`hvd_adaptive.data.pypi`; a fetch that stops part way resumes where it stopped, and a
repeated fetch requests nothing.

:func:`hvd_adaptive.data.pypi.build` builds the files from these records: keywords as ``kw:``
labels (by the same rules), TF-IDF of the name's and description's words, each row
L2-normalized, labels seen on fewer than two rows and rows without a label dropped.

Command line (fetches, cached, then builds)::

    hvd-adaptive data npm --out data/npm --packages 30000
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Optional

from . import pypi
from .formats import DataError

REGISTRY_URL = "https://registry.npmjs.org"
DESCRIPTION_CHARS = 4000
# Where the crawl starts: widely used packages of several kinds (web servers, front-end
# frameworks, build and test tools, utilities, databases, command-line tools).
SEEDS = ("express", "react", "vue", "@angular/core", "lodash", "webpack", "eslint", "jest",
         "typescript", "axios", "mongoose", "pg", "commander", "chalk", "socket.io", "d3",
         "three", "electron", "next", "moment")
_DEP_FIELDS = ("dependencies", "devDependencies", "peerDependencies", "optionalDependencies")
_NAME = re.compile(r"(@[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")
MAX_NAME_CHARS = 214  # npm's limit


def valid_name(name) -> bool:
    """Whether a dependency's key is a package name the crawl requests."""
    return (isinstance(name, str) and len(name) <= MAX_NAME_CHARS
            and _NAME.fullmatch(name) is not None)


def keep(name: str, manifest: dict) -> dict:
    """A package's record from its latest manifest."""
    desc = manifest.get("description")
    kw = manifest.get("keywords")
    if isinstance(kw, list):
        kw = ",".join(x for x in kw if isinstance(x, str))
    deps = set()
    for field in _DEP_FIELDS:
        d = manifest.get(field)
        if isinstance(d, dict):
            deps.update(k for k in d if valid_name(k))
    deps.discard(name)
    return {"name": name, "status": "ok",
            "summary": desc[:DESCRIPTION_CHARS] if isinstance(desc, str) else None,
            "description": None, "keywords": kw if isinstance(kw, str) else None,
            "classifiers": [], "deps": sorted(deps)}


def fetch_package(name: str, registry_url: str = REGISTRY_URL, timeout: float = 30.0,
                  retries: int = 3) -> dict:
    """One package's record (:func:`hvd_adaptive.data.pypi.fetch_record` of its latest
    manifest)."""
    url = f"{registry_url}/{urllib.parse.quote(name, safe='@/')}/latest"
    return pypi.fetch_record(name, url, keep, timeout, retries)


def fetch(out_dir, n_packages: int, workers: int = 8, *, seeds=SEEDS, timeout: float = 30.0,
          retries: int = 3, progress_every: float = 10.0, retry_failed: bool = False,
          registry_url: str = REGISTRY_URL) -> dict:
    """Crawl (into the cache) the manifests of `n_packages` packages from `seeds`.

    Level by level: the names of a level in name order, as many as are still wanted, are
    fetched (those not in ``out_dir/records.jsonl``; with ``retry_failed`` those recorded as
    failed too); the next level is every name they depend on not taken before. Names without a
    manifest (404) or whose fetch failed are taken too (their records say so), so the sample is
    the same whenever the registry answers the same.

    Returns:
        The fetch's description (also written to ``out_dir/fetch.json``): the arguments, when
        the first and the latest fetch ran, the statuses of the sample's records, the levels'
        sizes, and ``wanted``, the sampled names.
    """
    if n_packages < 1 or workers < 1 or retries < 0:
        raise ValueError(f"n_packages ({n_packages}) and workers ({workers}) must be >= 1, "
                         f"retries ({retries}) >= 0")
    bad = [s for s in seeds if not valid_name(s)]
    if bad or not seeds:
        raise ValueError(f"seeds must be npm package names, got {bad or 'none'}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    have = pypi.cached_records(path)
    meta_path = out / "fetch.json"
    old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    skip = {"ok", "not_found"} if retry_failed else {"ok", "not_found", "error"}
    started = pypi._now()
    wanted: list[str] = []
    levels: list[int] = []
    counts: Counter = Counter()
    requested = labelled = 0
    t0 = time.perf_counter()
    level = sorted(set(seeds))
    taken = set(level)

    def describe(first_fetch, last_fetch):
        return {"source": "npm", "registry_url": registry_url, "seeds": list(seeds),
                "n_packages": n_packages, "workers": workers, "first_fetch": first_fetch,
                "last_fetch": last_fetch, "levels": levels, "ok": counts["ok"],
                "not_found": counts["not_found"], "error": counts["error"]}

    while level and len(wanted) < n_packages:
        level = level[:n_packages - len(wanted)]
        todo = [n for n in level if have.get(n, {}).get("status") not in skip]
        if todo and not requested and not old.get("first_fetch"):
            # Written before the first request too, so a crawl cut short still dates its records.
            pypi._atomic_write(meta_path, json.dumps(describe(started, None), indent=1) + "\n")
        if todo:
            print(f"level {len(levels)}: fetching {len(todo)} of {len(level)} packages "
                  f"({len(level) - len(todo)} cached) with {workers} threads", flush=True)
            labelled += pypi._fetch_all(
                path, todo, len(todo), Counter(), workers, progress_every,
                lambda n: fetch_package(n, registry_url, timeout, retries), noun="packages")
            requested += len(todo)
            have = pypi.cached_records(path)
        wanted += level
        levels.append(len(level))
        counts.update(have[n]["status"] for n in level)
        nxt = {d for n in level if have[n].get("status") == "ok" for d in have[n].get("deps", ())}
        level = sorted(nxt - taken)
        taken.update(level)
    info = describe(old.get("first_fetch") or (started if requested else None),
                    pypi._now() if requested else old.get("last_fetch"))
    elapsed = time.perf_counter() - t0
    if requested:
        print(f"fetched {requested} packages in {elapsed:.0f} s "
              f"({requested / max(elapsed, 1e-9):.1f}/s), {labelled} of them with a label",
              flush=True)
    if len(wanted) < n_packages:
        print(f"the crawl ran out of names at {len(wanted)} packages (of {n_packages} wanted)",
              flush=True)
    print(f"sample: {len(wanted)} packages in {len(levels)} levels, {counts['ok']} ok, "
          f"{counts['not_found']} not found, {counts['error']} failed", flush=True)
    text = json.dumps(info, indent=1) + "\n"
    if not meta_path.is_file() or meta_path.read_text() != text:
        pypi._atomic_write(meta_path, text)
    return dict(info, wanted=wanted)


def run(out, packages=30000, seed=1, workers=8, min_label_count=2, min_feature_df=2,
        max_features=200_000, test_fraction=0.25, retry_failed=False, *,
        registry_url: str = REGISTRY_URL, seeds=SEEDS) -> dict:
    """Crawl (cached) the sample, then build the data set of its records into `out`;
    prints and returns the data set's ``info``."""
    t0 = time.perf_counter()
    meta = fetch(out, packages, workers, retry_failed=retry_failed, seeds=seeds,
                 registry_url=registry_url)
    if not meta["ok"]:
        raise DataError(f"{out}: no package of the sample was fetched "
                        f"({meta['error']} failed, {meta['not_found']} not found)")
    return pypi.build_sample(out, meta, t0, test_fraction=test_fraction, seed=seed,
                             min_label_count=min_label_count, min_feature_df=min_feature_df,
                             max_features=max_features)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `hvd-adaptive data npm` (and of `python -m hvd_adaptive.data.npm`)."""
    parser.add_argument("--out", required=True, help="folder for the crawl's cache and the data set")
    parser.add_argument("--packages", type=int, default=30000,
                        help="packages taken by the crawl (default 30000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the train/test split")
    pypi.add_build_arguments(parser)
    parser.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Runs the parsed options; a network, output-folder or data error is one line on stderr."""
    return pypi.report_errors("npm", lambda: run(
        args.out, args.packages, args.seed, args.workers, args.min_label_count,
        args.min_feature_df, args.max_features, args.test_fraction, args.retry_failed))


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m hvd_adaptive.data.npm ARGS``: the options of ``hvd-adaptive data npm``."""
    return pypi.module_main("hvd_adaptive.data.npm", "crawl (cached) npm packages' manifests "
                            "and write a real XC train/test pair", add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
