"""A real XMC data set from PyPI's project metadata: words of a project's text, its keywords
and content classifiers as labels.

Two steps, both usable alone:

* :func:`fetch` takes the list of every project name from PyPI's simple index (kept in
  ``out_dir/index.txt``, so the sample stays the same when PyPI grows), draws a seeded sample
  of ``n_projects`` names and fetches each project's JSON metadata with a pool of threads. Of
  each project it keeps ``name, summary, description`` (the first 4,000 characters),
  ``keywords`` and ``classifiers`` as one JSON line of ``out_dir/records.jsonl``, appended as
  results arrive. Names PyPI does not know (404) and names that failed after the retries are
  recorded as well (with a ``status``), so a fetch that stops part way resumes where it
  stopped and a repeated fetch requests nothing.
* :func:`build` turns records into train/test files in the Extreme Classification format
  (:func:`hvd_adaptive.data.formats.write_xc`), with ``labels.txt``, ``features.txt`` (names
  by id) and ``info.json`` (the shape and its provenance).

Labels of a project: each keyword as ``kw:<keyword>`` (the keywords string is split on commas,
or on whitespace when it has no comma; lowercased, punctuation stripped at both ends except a
trailing ``+`` or ``#``, which keeps ``c++`` and ``c#``; empty ones and ones longer than 40
characters dropped) and each classifier under ``Topic ::``, ``Framework ::`` or
``Environment ::`` as ``cls:<classifier>``. The other classifiers (Python versions, licenses,
operating systems, development status, intended audience, natural language) are on nearly
every project or say nothing about its content: "Intended Audience :: Developers" alone would
be on over half of the rows (docs/accuracy.md), so predicting it for every row would score a
high P@1 while saying nothing about the project.

Features: lowercase word tokens (:data:`TOKEN`, trailing dots stripped) of the name (split at
``-``, ``_`` and ``.``), the summary and the description, valued TF-IDF (``1 + log tf`` times
``log(N/df) + 1`` with ``N`` and ``df`` from the training rows), each row L2-normalized.

Command line (fetches, cached, then builds)::

    python -m hvd_adaptive.data.pypi --out data/pypi --projects 80000 --seed 1 --workers 8
"""
from __future__ import annotations

import argparse
import html
import http.client
import json
import os
import random
import re
import ssl
import string
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import scipy.sparse as sp

from .formats import DataError, Dataset, atomic_text, write_xc

INDEX_URL = "https://pypi.org/simple/"
PROJECT_URL = "https://pypi.org/pypi/{name}/json"
USER_AGENT = "hvd_adaptive-pypi-data/0.1 (research data set; python-urllib)"
DESCRIPTION_CHARS = 4000
MAX_KEYWORD_CHARS = 40
LABEL_CLASSIFIERS = ("Topic ::", "Framework ::", "Environment ::")
TOKEN = re.compile(r"[a-z][a-z0-9_+#.-]{1,30}")
_NAME_SPLIT = re.compile(r"[-_.]+")
_LEAD_STRIP = string.punctuation + string.whitespace + "\u201c\u201d\u2018\u2019"
_TRAIL_STRIP = _LEAD_STRIP.replace("+", "").replace("#", "")
_FIELDS = ("summary", "description", "keywords")


# ----------------------------------------------------------------------------- records


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _check_record(rec, path, line: int) -> dict:
    """A record as read from line `line` of `path`, or DataError naming the line."""
    if not isinstance(rec, dict):
        raise DataError(f"{path}:{line}: expected a JSON object, got {type(rec).__name__}")
    name = rec.get("name")
    if not isinstance(name, str) or not name.strip() or "\n" in name or "\r" in name:
        raise DataError(f"{path}:{line}: 'name' must be a non-empty string, got {name!r}")
    status = rec.get("status", "ok")
    if status not in ("ok", "not_found", "error"):
        raise DataError(f"{path}:{line}: unknown status {status!r} (ok, not_found or error)")
    for k in _FIELDS:
        v = rec.get(k)
        if k == "keywords" and isinstance(v, list):
            v = ",".join(x for x in v if isinstance(x, str))
            rec[k] = v
        if v is not None and not isinstance(v, str):
            raise DataError(f"{path}:{line}: {k!r} must be a string or null, "
                            f"got {type(v).__name__}")
    cls = rec.get("classifiers")
    if cls is not None and not (isinstance(cls, list) and all(isinstance(c, str) for c in cls)):
        raise DataError(f"{path}:{line}: 'classifiers' must be a list of strings or null")
    return rec


def read_records(path) -> list[dict]:
    """Every record of a records file (JSON lines), in file order; blank lines are skipped.

    Raises:
        FileNotFoundError: For a missing file.
        DataError: (a ValueError) for a file without records, or a line that is not a JSON
            object with a one-line, non-empty ``name`` and fields of the right types, naming
            the line.
    """
    path = os.fspath(path)
    out = []
    with open(path, "rb") as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError as e:
                raise DataError(f"{path}:{line}: not valid JSON ({e})") from None
            out.append(_check_record(rec, path, line))
    if not out:
        raise DataError(f"{path}: empty records file (no records)")
    return out


def latest_records(records: Iterable[dict]) -> dict[str, dict]:
    """The last record of each name (a later line replaces an earlier one), by name."""
    return {r["name"]: r for r in records}


def cached_records(path: Path) -> dict[str, dict]:
    """The last record of each name in a fetch's records file (:func:`latest_records`), its
    unfinished last line cut off first (:func:`_repair_tail`); empty where there is none."""
    if path.is_file() and path.stat().st_size:
        _repair_tail(path)
        if path.stat().st_size:
            return latest_records(read_records(path))
    return {}


def _repair_tail(path: Path) -> None:
    """Cut a partial last line (an append interrupted mid-write) off the records file."""
    size = path.stat().st_size
    if not size:
        return
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
        cut = tail.rfind(b"\n")
        keep = size - len(tail) + cut + 1 if cut >= 0 else 0
        if cut < 0 and size > len(tail):
            raise DataError(f"{path}: last line longer than 1 MiB and unfinished")
        f.truncate(keep)
    print(f"{path}: dropped an unfinished last line ({size - keep} bytes)", flush=True)


def _atomic_write(path: Path, text: str) -> None:
    with atomic_text(path) as f:
        f.write(text)


# ----------------------------------------------------------------------------- fetching


def _get(url: str, timeout: float, accept: Optional[str] = None):
    """GET a URL with urllib (the index: one request); returns (body, content type)."""
    headers = {"User-Agent": USER_AGENT}
    if accept:
        headers["Accept"] = accept
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def parse_index(body: bytes, content_type: str = "") -> list[str]:
    """Project names of a simple-index page: PEP 691 JSON (``projects[].name``) or the PEP 503
    HTML page of links (PyPI may answer HTML whatever ``Accept`` asked for)."""
    if "json" in content_type or body.lstrip()[:1] == b"{":
        return [p["name"] for p in json.loads(body)["projects"]]
    text = body.decode("utf-8", "replace")
    return [html.unescape(m).strip() for m in re.findall(r"<a\s[^>]*>([^<]*)</a>", text)]


def load_index(out_dir, index_url: str = INDEX_URL, timeout: float = 120.0) -> list[str]:
    """The sorted, distinct project names of the simple index, from ``out_dir/index.txt`` if
    present, else downloaded (with its date in ``out_dir/index.json``) and saved there."""
    out = Path(out_dir)
    cached = out / "index.txt"
    if cached.is_file():
        names = cached.read_text(encoding="utf-8").split("\n")
        return [n for n in names if n]
    t0 = time.perf_counter()
    body, ctype = _get(index_url, timeout, "application/vnd.pypi.simple.v1+json")
    names = sorted({n for n in parse_index(body, ctype) if n and "\n" not in n})
    if not names:
        raise DataError(f"{index_url}: no project names in the index ({len(body)} bytes)")
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(cached, "".join(n + "\n" for n in names))
    _atomic_write(out / "index.json", json.dumps(
        {"url": index_url, "date": _now(), "names": len(names)}, indent=1) + "\n")
    print(f"index: {len(names)} project names from {index_url} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return names


def sample_names(names: list[str], n_projects: int, seed: int) -> list[str]:
    """The first `n_projects` names of the seeded permutation: a larger sample of the same
    index and seed contains every smaller one."""
    perm = np.random.default_rng(seed).permutation(len(names))
    return [names[i] for i in perm[:n_projects].tolist()]


def _keep(name: str, info: dict) -> dict:
    desc = info.get("description")
    kw = info.get("keywords")
    if isinstance(kw, list):
        kw = ",".join(x for x in kw if isinstance(x, str))
    cls = info.get("classifiers")
    return {"name": name, "status": "ok",
            "summary": info.get("summary") if isinstance(info.get("summary"), str) else None,
            "description": desc[:DESCRIPTION_CHARS] if isinstance(desc, str) else None,
            "keywords": kw if isinstance(kw, str) else None,
            "classifiers": [c for c in cls if isinstance(c, str)] if isinstance(cls, list) else []}


class _HTTPStatus(Exception):
    def __init__(self, code: int):
        super().__init__(f"HTTP {code}")
        self.code = code


_local = threading.local()


def _get_kept_alive(url: str, timeout: float, redirects: int = 3) -> bytes:
    """GET a URL over this thread's persistent connection to its host (opened on first use,
    closed and dropped after any error); follows redirects. Raises _HTTPStatus on other
    answers than 200.

    One connection a thread, reused: new connections (as ``urlopen`` opens for every request)
    served few requests a second, fewer with more threads, some connects stalling for seconds;
    as many persistent connections served several times as many (docs/benchmark.md, "Figures
    behind the code's defaults").
    """
    u = urllib.parse.urlsplit(url)
    key = (u.scheme, u.netloc)
    conns = _local.__dict__.setdefault("conns", {})
    conn = conns.get(key)
    if conn is None:
        if u.scheme == "https":
            conn = http.client.HTTPSConnection(u.netloc, timeout=timeout,
                                               context=ssl.create_default_context())
        elif u.scheme == "http":
            conn = http.client.HTTPConnection(u.netloc, timeout=timeout)
        else:
            raise ValueError(f"{url}: only http and https URLs")
        conns[key] = conn
    path = u.path + ("?" + u.query if u.query else "")
    try:
        conn.request("GET", path or "/", headers={"User-Agent": USER_AGENT})
        resp = conn.getresponse()
        body = resp.read()  # read whatever the status, so the connection can serve the next
    except BaseException:
        conn.close()
        conns.pop(key, None)
        raise
    if resp.will_close:
        conn.close()
        conns.pop(key, None)
    if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location") and redirects:
        return _get_kept_alive(urllib.parse.urljoin(url, resp.getheader("Location")), timeout,
                               redirects - 1)
    if resp.status != 200:
        raise _HTTPStatus(resp.status)
    return body


def fetch_record(name: str, url: str, keep, timeout: float = 30.0, retries: int = 3) -> dict:
    """One name's record: ``keep(name, the answer's JSON)`` (the kept fields, status ``ok``), or
    status ``not_found`` (404/410), or ``error`` (with the last error) after ``retries``
    retries of timeouts, connection errors, 429 and 5xx answers and unreadable JSON (waits of
    1, 2, 4, ... s, jittered). Requests go over the calling thread's persistent connection
    (:func:`_get_kept_alive`)."""
    err = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(30.0, 2.0 ** (attempt - 1)) * (0.5 + random.random()))
        try:
            return keep(name, json.loads(_get_kept_alive(url, timeout)))
        except _HTTPStatus as e:
            if e.code in (404, 410):
                return {"name": name, "status": "not_found"}
            err = str(e)
            if e.code != 429 and e.code < 500:
                break
        except Exception as e:  # noqa: BLE001 - timeouts, resets, bad JSON: retried, then recorded
            err = f"{type(e).__name__}: {e}"
    return {"name": name, "status": "error", "error": err[:300]}


def fetch_project(name: str, project_url: str = PROJECT_URL, timeout: float = 30.0,
                  retries: int = 3) -> dict:
    """One PyPI project's record (:func:`fetch_record` of its JSON API's ``info``)."""
    url = project_url.format(name=urllib.parse.quote(name, safe=""))
    return fetch_record(name, url, lambda n, d: _keep(n, d["info"]), timeout, retries)


def fetch(out_dir, n_projects: int, seed: int, workers: int = 8, *, timeout: float = 30.0,
          retries: int = 3, progress_every: float = 10.0, retry_failed: bool = False,
          index_url: str = INDEX_URL, project_url: str = PROJECT_URL) -> dict:
    """Fetch (into the cache) the metadata of a seeded sample of PyPI projects.

    Names already in ``out_dir/records.jsonl`` (with any status; with ``retry_failed`` only
    ``ok`` and ``not_found`` ones) are not requested again; new records are appended as they
    arrive, so an interrupted fetch loses at most the records in flight. Progress (done /
    wanted, rate, records kept, records with a label) is printed every `progress_every` s.

    Args:
        out_dir: The cache folder (``index.txt``, ``records.jsonl``, ``fetch.json``).
        n_projects: Size of the sample of names.
        seed: Seed of the sample (``numpy.random.default_rng(seed).permutation``).
        workers: Threads fetching at once.
        timeout: Seconds a request may take.
        retries: Retries of a failed request.
        progress_every: Seconds between progress lines.
        retry_failed: Request names recorded with status ``error`` again.
        index_url: The simple index.
        project_url: The JSON API, with ``{name}``.

    Returns:
        The fetch's description (also written to ``out_dir/fetch.json``): the arguments, the
        index's date and size, ``first_fetch`` (when the first fetch that requested projects
        began), ``last_fetch`` (when the latest one ended), the statuses of the sample's
        records, and ``wanted``, the sampled names.
    """
    if n_projects < 1 or workers < 1 or retries < 0:
        raise ValueError(f"n_projects ({n_projects}) and workers ({workers}) must be >= 1, "
                         f"retries ({retries}) >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = load_index(out, index_url)
    wanted = sample_names(names, n_projects, seed)
    path = out / "records.jsonl"
    have = {n: r.get("status", "ok") for n, r in cached_records(path).items()}
    skip = {"ok", "not_found"} if retry_failed else {"ok", "not_found", "error"}
    todo = [n for n in wanted if have.get(n) not in skip]
    meta_path = out / "fetch.json"
    old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    index_json = out / "index.json"
    index_meta = json.loads(index_json.read_text()) if index_json.is_file() else {}
    todo_set = set(todo)
    counts = Counter(have[n] for n in wanted if n in have and n not in todo_set)
    labelled = 0
    t0 = time.perf_counter()

    def describe(last_fetch):
        return {"source": "pypi", "index_url": index_url, "index_date": index_meta.get("date"),
                "index_names": len(names), "n_projects": n_projects, "seed": seed,
                "workers": workers,
                "first_fetch": old.get("first_fetch") or (started if todo else None),
                "last_fetch": last_fetch, "ok": counts["ok"],
                "not_found": counts["not_found"], "error": counts["error"]}

    started = _now()
    if todo:
        # Written before fetching too, so a fetch cut short still dates the records it left.
        _atomic_write(meta_path, json.dumps(describe(old.get("last_fetch")), indent=1) + "\n")
        print(f"fetching {len(todo)} of {len(wanted)} projects ({len(wanted) - len(todo)} "
              f"cached) with {workers} threads", flush=True)
        labelled = _fetch_all(path, todo, len(wanted), counts, workers, progress_every,
                              lambda n: fetch_project(n, project_url, timeout, retries))
    elapsed = time.perf_counter() - t0
    info = describe(_now() if todo else old.get("last_fetch"))
    if todo:
        rate = len(todo) / max(elapsed, 1e-9)
        print(f"fetched {len(todo)} projects in {elapsed:.0f} s ({rate:.1f}/s), {labelled} of "
              f"them with a label; sample: {counts['ok']} ok, {counts['not_found']} not found, "
              f"{counts['error']} failed", flush=True)
    else:
        print(f"all {len(wanted)} projects of the sample are cached in {path}", flush=True)
    text = json.dumps(info, indent=1) + "\n"
    if not meta_path.is_file() or meta_path.read_text() != text:
        _atomic_write(meta_path, text)
    return dict(info, wanted=wanted)


def _fetch_all(path: Path, todo: list[str], n_wanted: int, counts: Counter, workers: int,
               progress_every: float, get, noun: str = "projects") -> int:
    """Fetch `todo` with `workers` threads, appending each record as it arrives; updates
    `counts` (statuses of the sample) and returns how many new records have a label."""
    labelled = done = 0
    t0 = last = time.perf_counter()
    names = iter(todo)
    base = n_wanted - len(todo)
    with open(path, "a", encoding="ascii", newline="\n") as f, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        pending: set = set()
        try:
            while True:
                while len(pending) < 2 * workers:
                    name = next(names, None)
                    if name is None:
                        break
                    pending.add(pool.submit(get, name))
                if not pending:
                    break
                ready, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                for fut in ready:
                    rec = fut.result()
                    f.write(json.dumps(rec, ensure_ascii=True) + "\n")
                    f.flush()
                    counts[rec["status"]] += 1
                    labelled += rec["status"] == "ok" and bool(record_labels(rec))
                    done += 1
                now = time.perf_counter()
                if now - last >= progress_every:
                    last = now
                    print(f"  {base + done}/{n_wanted} {noun}, {done / (now - t0):.1f}/s, "
                          f"{counts['ok']} kept ({labelled} new with a label), "
                          f"{counts['not_found']} not found, {counts['error']} failed",
                          flush=True)
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
    return labelled


# ----------------------------------------------------------------------------- building


def _clean_keyword(word: str) -> str:
    w = " ".join(word.lower().split()).lstrip(_LEAD_STRIP).rstrip(_TRAIL_STRIP)
    return w if len(w) <= MAX_KEYWORD_CHARS else ""


def keyword_labels(keywords: Optional[str]) -> list[str]:
    """The ``kw:`` labels of a keywords string (distinct, in order of appearance)."""
    if not keywords:
        return []
    parts = keywords.split(",") if "," in keywords else keywords.split()
    words = (_clean_keyword(p) for p in parts)
    return list(dict.fromkeys("kw:" + w for w in words if w))


def classifier_labels(classifiers: Optional[list[str]]) -> list[str]:
    """The ``cls:`` labels: the classifiers under :data:`LABEL_CLASSIFIERS` (distinct)."""
    out = (" ".join(c.split()) for c in classifiers or ())
    return list(dict.fromkeys("cls:" + c for c in out if c.startswith(LABEL_CLASSIFIERS)))


def record_labels(rec: dict) -> list[str]:
    """Every candidate label of a record (keywords first, then classifiers)."""
    return keyword_labels(rec.get("keywords")) + classifier_labels(rec.get("classifiers"))


def tokens(text: Optional[str]) -> list[str]:
    """Word tokens of a text: :data:`TOKEN` matches of the lowercased text, trailing dots
    stripped, at least two characters long."""
    if not text:
        return []
    out = (t.rstrip(".") for t in TOKEN.findall(text.lower()))
    return [t for t in out if len(t) >= 2]


def record_tokens(rec: dict) -> list[str]:
    """Tokens of a record's name (split at ``-``, ``_``, ``.``), summary and description."""
    return (tokens(_NAME_SPLIT.sub(" ", rec["name"])) + tokens(rec.get("summary"))
            + tokens(rec.get("description")))


def _csr(rows: list[list[int]], vals: Optional[list[list[int]]], n_cols: int) -> sp.csr_matrix:
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=indptr[1:])
    idx = np.fromiter((i for r in rows for i in r), np.int64, int(indptr[-1]))
    data = (np.ones(len(idx), np.float64) if vals is None
            else np.fromiter((v for r in vals for v in r), np.float64, int(indptr[-1])))
    return sp.csr_matrix((data, idx, indptr), shape=(len(rows), n_cols))


def _col_counts(m: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """How many of the given rows have each column (entries are distinct within a row)."""
    return np.bincount(m[rows].indices, minlength=m.shape[1])


def _ranked(ids: np.ndarray, freq: np.ndarray, names: list[str]) -> np.ndarray:
    """`ids` ordered by descending `freq`, ties by name."""
    return np.array(sorted(ids.tolist(), key=lambda i: (-int(freq[i]), names[i])), np.int64)


def build(records, out_dir, test_fraction: float = 0.25, seed: int = 1,
          min_label_count: int = 2, min_feature_df: int = 2, max_features: int = 200_000,
          fetch_info: Optional[dict] = None, names: Optional[Iterable[str]] = None) -> dict:
    """Build and write the XMC data set of PyPI records.

    Steps: records with status ``ok`` (the last one of each name), in name order; the
    candidate labels (:func:`record_labels`) of each, labels on fewer than `min_label_count`
    rows dropped and rows without a label dropped; a seeded split (``round(test_fraction *
    rows)`` test rows, ``numpy.random.default_rng(seed).permutation``); the vocabulary: tokens
    on at least `min_feature_df` training rows, the `max_features` most frequent. Rows with no
    vocabulary token are dropped; labels and vocabulary are then recounted on the rows left
    until no row drops, so every label is on at least `min_label_count` rows (train and test)
    and every feature on `min_feature_df` training rows. Label ids follow the descending
    training frequency, feature ids the descending training document frequency (ties by
    name); rows are written in the split's random order.

    Args:
        records: A records file (path) or its records (dicts).
        out_dir: Output folder: ``train.txt``, ``test.txt`` (XC format with header),
            ``labels.txt``, ``features.txt`` (a name per line, by id), ``train_names.txt``,
            ``test_names.txt`` (each row's project), ``info.json``.
        test_fraction: Share of rows in the test file, in (0, 1).
        seed: Seed of the split.
        min_label_count: Rows (train and test) a label needs.
        min_feature_df: Training rows a token needs to be a feature.
        max_features: Largest vocabulary.
        fetch_info: The fetch's description for ``info.json``; by default ``fetch.json``
            beside a records file.
        names: Only the records of these names (e.g. the fetch's sample, where the cache
            holds a larger one); default all.

    Returns:
        The contents of ``info.json``.

    Raises:
        DataError: (a ValueError) for an empty or malformed records file (naming the line)
            or when no row is left.
        ValueError: For arguments out of range.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction {test_fraction}: must be in (0, 1)")
    if min(min_label_count, min_feature_df, max_features) < 1:
        raise ValueError("min_label_count, min_feature_df and max_features must be >= 1")
    src = "records"
    if isinstance(records, (str, os.PathLike)):
        src = os.fspath(records)
        if fetch_info is None and (Path(src).parent / "fetch.json").is_file():
            fetch_info = json.loads((Path(src).parent / "fetch.json").read_text())
        records = read_records(src)
    else:
        records = [_check_record(dict(r), src, i) for i, r in enumerate(records, start=1)]
    latest = latest_records(records)
    if names is not None:
        names = set(names)
        latest = {k: v for k, v in latest.items() if k in names}
    recs = [r for _, r in sorted(latest.items()) if r.get("status", "ok") == "ok"]

    tok_id: dict[str, int] = {}
    lab_id: dict[str, int] = {}
    row_tok, row_cnt, row_lab, row_name = [], [], [], []
    for r in recs:
        labs = record_labels(r)
        cnt = Counter(record_tokens(r))
        if not labs or not cnt:
            continue
        row_name.append(r["name"])
        row_lab.append([lab_id.setdefault(x, len(lab_id)) for x in labs])
        row_tok.append([tok_id.setdefault(t, len(tok_id)) for t in cnt])
        row_cnt.append(list(cnt.values()))
    if not row_name:
        raise DataError(f"{src}: no record has both a label and a word ({len(recs)} records ok)")
    tok_names, lab_names = list(tok_id), list(lab_id)
    counts = _csr(row_tok, row_cnt, len(tok_names))
    labels = _csr(row_lab, None, len(lab_names))
    del row_tok, row_cnt, row_lab

    def label_filter(rows):
        keep = _col_counts(labels, rows) >= min_label_count
        return keep, rows[labels[rows][:, keep].getnnz(axis=1) > 0]

    _, rows = label_filter(np.arange(len(row_name)))
    if not len(rows):
        raise DataError(f"{src}: no label is on {min_label_count} rows or more")
    n_test = int(round(test_fraction * len(rows)))
    perm = rows[np.random.default_rng(seed).permutation(len(rows))]
    is_test = np.zeros(len(row_name), bool)
    is_test[perm[:n_test]] = True
    while True:
        keep_lab, rows = label_filter(rows)
        df = _col_counts(counts, rows[~is_test[rows]])
        vocab = _ranked(np.flatnonzero(df >= min_feature_df), df, tok_names)[:max_features]
        has_feat = counts[rows][:, vocab].getnnz(axis=1) > 0
        if has_feat.all():
            break
        rows = rows[has_feat]
    alive = np.zeros(len(row_name), bool)
    alive[rows] = True
    order = perm[alive[perm]]  # the split's random order
    train_rows, test_rows = order[~is_test[order]], order[is_test[order]]
    if not len(train_rows) or not len(test_rows):
        raise DataError(f"{src}: {len(train_rows)} training and {len(test_rows)} test rows left")

    lab_freq = _col_counts(labels, train_rows)
    lab_order = _ranked(np.flatnonzero(keep_lab), lab_freq, lab_names)
    x = counts[:, vocab].tocsr()
    x.data = 1.0 + np.log(x.data)
    idf = np.log(len(train_rows) / df[vocab]) + 1.0
    x = (x @ sp.diags(idf)).tocsr()
    y = labels[:, lab_order].tocsr()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = {}
    for part, sel in (("train", train_rows), ("test", test_rows)):
        xs, ys = x[sel], y[sel]
        xs.sort_indices()
        ys.sort_indices()
        norms = np.sqrt(np.asarray(xs.multiply(xs).sum(axis=1)).ravel())
        xs = sp.diags(1.0 / norms) @ xs
        xs = xs.tocsr()
        xs.sort_indices()
        ds = Dataset(xs.indptr.astype(np.int64), xs.indices.astype(np.int32),
                     xs.data.astype(np.float32), ys.indptr.astype(np.int64),
                     ys.indices.astype(np.int32), len(vocab), len(lab_order),
                     str(out / f"{part}.txt"))
        write_xc(out / f"{part}.txt", ds, header=True)
        _atomic_write(out / f"{part}_names.txt", "".join(row_name[i] + "\n" for i in sel))
        parts[part] = ds
    _atomic_write(out / "labels.txt", "".join(lab_names[i] + "\n" for i in lab_order))
    _atomic_write(out / "features.txt", "".join(tok_names[i] + "\n" for i in vocab))

    both = order
    n_lab = np.diff(y[both].indptr)
    n_feat = np.diff(x[both].indptr)
    freq = lab_freq[lab_order]
    freq_all = freq + _col_counts(y, test_rows)
    kinds = Counter(lab_names[i].split(":", 1)[0] for i in lab_order)
    info = {
        "rows": {"train": len(train_rows), "test": len(test_rows)},
        "features": len(vocab), "labels": len(lab_order),
        "median_labels_per_row": float(np.median(n_lab)),
        "mean_labels_per_row": round(float(n_lab.mean()), 3),
        "median_features_per_row": float(np.median(n_feat)),
        "mean_features_per_row": round(float(n_feat.mean()), 3),
        "labels_by_kind": {k: kinds[k] for k in sorted(kinds)},
        "labels_with_train_rows_at_least": {str(k): int((freq >= k).sum())
                                            for k in (1, 2, 5, 10, 100, 1000)},
        "labels_with_rows_at_least": {str(k): int((freq_all >= k).sum())
                                      for k in (2, 5, 10, 100, 1000)},
        "build": {"records": src, "records_sampled": len(latest), "records_ok": len(recs),
                  "test_fraction": test_fraction, "seed": seed, "min_label_count": min_label_count,
                  "min_feature_df": min_feature_df, "max_features": max_features},
        "fetch": {k: v for k, v in (fetch_info or {}).items() if k != "wanted"},
    }
    _atomic_write(out / "info.json", json.dumps(info, indent=1) + "\n")
    return info


# ----------------------------------------------------------------------------- command line


def run(out, projects=80000, seed=1, workers=8, min_label_count=2, min_feature_df=2,
        max_features=200_000, test_fraction=0.25, retry_failed=False) -> dict:
    """Fetch (cached) the sample, then build the data set of its records into `out`;
    prints and returns the data set's ``info``."""
    t0 = time.perf_counter()
    meta = fetch(out, projects, seed, workers, retry_failed=retry_failed)
    return build_sample(out, meta, t0, test_fraction=test_fraction, seed=seed,
                        min_label_count=min_label_count, min_feature_df=min_feature_df,
                        max_features=max_features)


def build_sample(out, meta: dict, t0: float, **build_args) -> dict:
    """Builds the data set of a fetch's sample (`meta`, with ``wanted``) from ``out``'s records
    into `out`; prints its shape and the seconds since `t0`, and returns its ``info``."""
    t1 = time.perf_counter()
    info = build(Path(out) / "records.jsonl", out, fetch_info=meta, names=meta["wanted"],
                 **build_args)
    print(f"wrote {out}: {info['rows']['train']} train and {info['rows']['test']} test rows, "
          f"{info['features']} features, {info['labels']} labels (median "
          f"{info['median_labels_per_row']:g} labels, {info['median_features_per_row']:g} "
          f"features a row; {info['labels_with_train_rows_at_least']['10']} labels on >= 10 "
          f"training rows); build {time.perf_counter() - t1:.1f} s, "
          f"total {time.perf_counter() - t0:.1f} s", flush=True)
    return info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `hvd-adaptive data pypi` (and of `python -m hvd_adaptive.data.pypi`)."""
    parser.add_argument("--out", required=True, help="folder for the fetch's cache and the data set")
    parser.add_argument("--projects", type=int, default=80000, help="projects sampled (default 80000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample and of the split")
    add_build_arguments(parser)
    parser.set_defaults(fn=run_command)


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `hvd-adaptive data pypi` and `hvd-adaptive data npm` share: the fetch's
    threads and retries, and the build's filters and split."""
    parser.add_argument("--workers", type=int, default=8, help="fetching threads (default 8)")
    parser.add_argument("--min-label-count", type=int, default=2,
                        help="rows a label needs (train and test, default 2)")
    parser.add_argument("--min-feature-df", type=int, default=2,
                        help="training rows a word needs to be a feature (default 2)")
    parser.add_argument("--max-features", type=int, default=200_000, help="largest vocabulary")
    parser.add_argument("--test-fraction", type=float, default=0.25, help="share of test rows")
    parser.add_argument("--retry-failed", action="store_true",
                        help="request the names whose fetch failed earlier again")


def report_errors(command: str, call) -> int:
    """Runs `call()`; a network, output-folder or data error is one line on stderr (exit 2)."""
    try:
        call()
    except (OSError, DataError) as e:
        print(f"hvd-adaptive data {command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def run_command(args: argparse.Namespace) -> int:
    """Runs the parsed options; a network, output-folder or data error is one line on stderr."""
    return report_errors("pypi", lambda: run(
        args.out, args.projects, args.seed, args.workers, args.min_label_count,
        args.min_feature_df, args.max_features, args.test_fraction, args.retry_failed))


def module_main(module: str, description: str, add, argv: Optional[list[str]]) -> int:
    """``python -m MODULE ARGS``: parses `argv` with the options `add` puts on a parser and runs
    the command they set (``fn``)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    add(parser)
    args = parser.parse_args(argv)
    return args.fn(args)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m hvd_adaptive.data.pypi ARGS``: the options of ``hvd-adaptive data pypi``."""
    return module_main("hvd_adaptive.data.pypi", "fetch (cached) PyPI projects' metadata and "
                       "write a real XC train/test pair", add_arguments, argv)


if __name__ == "__main__":
    sys.exit(main())
