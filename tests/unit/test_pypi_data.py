"""Tests for hvd_adaptive.data.pypi: the XMC data set built from PyPI records (labels,
TF-IDF features, split, determinism, errors) and the cached fetch, against a local server."""
import http.server
import json
import math
import re
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hvd_adaptive.cli import build_parser
from hvd_adaptive.data import DataError, load_dataset
from hvd_adaptive.data import pypi

MIT = "License :: OSI Approved :: MIT License"
PY3 = "Programming Language :: Python :: 3"
OSI = "Operating System :: OS Independent"
BETA = "Development Status :: 4 - Beta"
DEVS = "Intended Audience :: Developers"
AI = "Topic :: Scientific/Engineering :: Artificial Intelligence"
WEB = "Topic :: Internet :: WWW/HTTP"
DJANGO = "Framework :: Django"
LONG_KW = "a keyword that is far too long to be a label"  # 44 characters, no comma
COMMON = [MIT, PY3, OSI, BETA]


def rec(name, summary, description, keywords, classifiers, status="ok"):
    return {"name": name, "status": status, "summary": summary, "description": description,
            "keywords": keywords, "classifiers": classifiers}


RECORDS = [
    rec("skyml", "Machine learning pipelines for sky survey images.",
        "# skyml\n\nA python package for machine learning on astronomical images. Train a "
        "classifier, evaluate it, and export the model.", "machine learning, astronomy, images",
        COMMON + [DEVS, AI, "Intended Audience :: Science/Research"]),
    rec("torch-lens", "Inspect neural networks layer by layer.",
        "torch-lens is a python package to visualize activations of deep learning models. "
        "Supports PyTorch 2.x.", "Deep Learning, Machine Learning, pytorch",
        COMMON + [DEVS, AI]),
    rec("tabular-boost", "Gradient boosting for tabular data.",
        "A small python library: gradient boosting trees for tabular data, with a scikit-learn "
        "compatible API. Machine learning made simple.", "machine-learning; boosting, tabular",
        COMMON + [DEVS, AI]),
    rec("quanneal", "Simulated quantum annealing.",
        "A python package that simulates quantum annealing for optimization problems.",
        "quantum-annealing", [MIT, PY3, BETA]),  # its only keyword is seen once: no label
    rec("nolabels", "Helpers.", "A python package of helpers with no keywords.", None,
        [MIT, PY3, OSI, BETA]),  # excluded classifiers only: no label
    rec("flask-hello", "Hello world for Flask.",
        "A python package showing a minimal Flask web application with a REST api.",
        "flask web api", COMMON + [DEVS, WEB, "Framework :: Flask"]),
    rec("flask-auth-kit", "Authentication for Flask apps.",
        "Login, logout and tokens for Flask web applications. A python package.",
        "Flask, authentication, web", COMMON + [DEVS, WEB, "Framework :: Flask"]),
    rec("django-shop", "A shop for Django.",
        "django-shop is a python package: an e-commerce shop for Django web sites.",
        "django, e-commerce, shop", COMMON + [DEVS, WEB, DJANGO]),
    rec("django-blogger", "Blogging for Django.",
        "Write and publish posts from the Django admin. A python package for web blogs.",
        "django, blog", COMMON + [DEVS, WEB, DJANGO]),
    rec("fastcsv", "Fast CSV reader in C++.", "A python package wrapping a C++ csv parser.",
        "csv, c++, parser", COMMON + [DEVS, "Topic :: Text Processing"]),
    rec("pyxml-lite", "Tiny XML parser written in C++.",
        "A python package with a small XML parser written in C++ and bindings.",
        "xml, c++, parser, " + LONG_KW, COMMON + [DEVS, "Topic :: Text Processing"]),
    rec("json-tools", "JSON helpers.", "A python package of JSON helpers: pretty print, "
        "diff, merge.", "json, " + LONG_KW, COMMON + [DEVS, "Topic :: Text Processing"]),
    rec("clickety", "Command line tools made easy.",
        "A python package for building command line interfaces with decorators.",
        "cli, command line", COMMON + [DEVS, "Environment :: Console"]),
    rec("termcolors", "Colors in the terminal.",
        "A python package to print colored text in the terminal and the command line.",
        "terminal cli colors", COMMON + [DEVS, "Environment :: Console"]),
    rec("ghost", None, None, None, None, status="not_found"),
    rec("flaky", None, None, None, None, status="error"),
    rec("dupe", None, None, None, None, status="error"),
    rec("geo-utils", "Geographic utilities.",
        "A python package for distances on the sphere, projections and geohashes.",
        "gis, geography", COMMON + ["Intended Audience :: Science/Research",
                                    "Topic :: Scientific/Engineering :: GIS"]),
    rec("mapplot", "Plot maps.", "A python package that plots maps with matplotlib. GIS data.",
        "gis, maps, plotting", COMMON + ["Intended Audience :: Science/Research",
                                         "Topic :: Scientific/Engineering :: GIS"]),
    rec("nlp-kit", "Natural language processing toolkit.",
        "Tokenizers, taggers and parsers: a python package for NLP in English and German.",
        "nlp, natural language processing, machine learning",
        COMMON + [DEVS, AI, "Natural Language :: English", "Natural Language :: German"]),
    rec("sentiment-de", "German sentiment analysis.",
        "A python package for sentiment analysis of German text with deep learning.",
        "nlp, sentiment, deep learning",
        COMMON + [DEVS, AI, "Natural Language :: German"]),
    rec("async-http", "Async HTTP client.",
        "An asyncio HTTP client: a python package with connection pooling and retries.",
        "http, asyncio, client", COMMON + [DEVS, WEB]),
    rec("http-mock", "Mock HTTP servers for tests.",
        "A python package to mock http servers in unit tests.", "http, testing, mock",
        COMMON + [DEVS, WEB, "Topic :: Software Development :: Testing"]),
    rec("pytest-snap", "Snapshot testing for pytest.",
        "A pytest plugin: snapshot testing. A python package for tests.",
        "pytest, testing, snapshot",
        COMMON + [DEVS, "Framework :: Pytest", "Topic :: Software Development :: Testing"]),
    rec("pytest-timer", "Time your pytest tests.",
        "A pytest plugin that reports the slowest tests. A python package.",
        "pytest, timing", COMMON + [DEVS, "Framework :: Pytest"]),
    rec("sqlhelper", "SQL helpers.", "A python package of helpers for SQL databases: "
        "connection strings and migrations.", "sql, database",
        COMMON + [DEVS, "Topic :: Database"]),
    rec("pgtools", "PostgreSQL tools.", "A python package for PostgreSQL databases: backups, "
        "migrations, sql.", "postgresql, sql, database", COMMON + [DEVS, "Topic :: Database"]),
    rec("imgresize", "Resize images.", "A python package to resize and crop images in batch.",
        "images, resize", COMMON + [DEVS, "Topic :: Multimedia :: Graphics"]),
    rec("thumbnailer", "Thumbnails of images.",
        "A python package that makes thumbnails of images and pdf pages.",
        "images, thumbnails", COMMON + [DEVS, "Topic :: Multimedia :: Graphics"]),
    rec("dupe", "Find duplicate files.",
        "A python package that finds duplicate files by hashing their content.",
        "files, duplicates, cli", COMMON + [DEVS, "Environment :: Console"]),
]
# Records with status ok that keep a label: every ok record but quanneal and nolabels.
EXPECTED_ROWS = sorted({r["name"] for r in RECORDS} - {"ghost", "flaky", "quanneal", "nolabels"})
TOKEN = re.compile(r"[a-z][a-z0-9_+#.-]{1,30}")


def write_records(path: Path, records=RECORDS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def words(r) -> list[str]:
    """The spec's tokens, written out again here: name split at -_. then summary, description."""
    text = " ".join([re.sub(r"[-_.]", " ", r["name"]), r["summary"] or "", r["description"] or ""])
    return [t for t in (m.rstrip(".") for m in TOKEN.findall(text.lower())) if len(t) >= 2]


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("pypi")
    info = pypi.build(write_records(d / "records.jsonl"), d / "out", test_fraction=0.25, seed=3)
    out = d / "out"
    train, test = (load_dataset(out / f"{p}.txt", use_cache=False) for p in ("train", "test"))
    return out, info, train, test


def row_labels(out: Path, part: str, ds) -> dict[str, set[str]]:
    names = lines(out / f"{part}_names.txt")
    labels = lines(out / "labels.txt")
    assert len(names) == ds.n_rows
    return {n: {labels[j] for j in ds.label_indices[ds.label_indptr[i]:ds.label_indptr[i + 1]]}
            for i, n in enumerate(names)}


def test_labels_are_keywords_and_content_classifiers_seen_twice(built):
    out, info, train, test = built
    labels = lines(out / "labels.txt")
    assert train.n_labels == test.n_labels == len(labels) == info["labels"]
    assert len(set(labels)) == len(labels)
    got = {**row_labels(out, "train", train), **row_labels(out, "test", test)}
    assert got["skyml"] == {"kw:machine learning", f"cls:{AI}", "kw:images"}
    assert got["torch-lens"] == {"kw:deep learning", "kw:machine learning", f"cls:{AI}"}
    # Keywords without a comma split on whitespace; c++ keeps its pluses.
    assert "kw:flask" in got["flask-hello"] and "kw:web" in got["flask-hello"]
    assert got["fastcsv"] >= {"kw:c++", "kw:parser"}
    assert "kw:cli" in got["termcolors"]  # from "terminal cli colors"
    # Seen once: no label (astronomy, quantum-annealing); seen twice but too long: no label.
    for gone in ("kw:astronomy", "kw:quantum-annealing", "kw:" + LONG_KW, "kw:pytorch"):
        assert gone not in labels
    # Near-universal classifiers and those that say nothing of the content are never labels,
    # though on every row.
    assert not [x for x in labels if x.startswith(("cls:License", "cls:Programming Language",
                                                   "cls:Operating System",
                                                   "cls:Development Status",
                                                   "cls:Intended Audience",
                                                   "cls:Natural Language"))]
    # Every label on at least 2 rows (train and test), each row has one.
    freq = train.label_frequencies() + test.label_frequencies()
    assert freq.min() >= 2
    assert np.diff(train.label_indptr).min() >= 1 and np.diff(test.label_indptr).min() >= 1
    # Label ids by descending training frequency.
    assert np.all(np.diff(train.label_frequencies()) <= 0)


def test_rows_split_and_dropped_records(built):
    out, info, train, test = built
    names = lines(out / "train_names.txt") + lines(out / "test_names.txt")
    # 404 and failed records, a row without a label left: not rows; the later record of a
    # name (dupe: error, then ok) wins.
    assert sorted(names) == EXPECTED_ROWS
    n = len(EXPECTED_ROWS)
    assert (test.n_rows, train.n_rows) == (round(0.25 * n), n - round(0.25 * n))
    assert info["rows"] == {"train": train.n_rows, "test": test.n_rows}
    assert info["median_labels_per_row"] == float(np.median(np.concatenate(
        [np.diff(train.label_indptr), np.diff(test.label_indptr)])))
    other = pypi.build(out.parent / "records.jsonl", out.parent / "other", seed=4)
    assert lines(out.parent / "other" / "test_names.txt") != lines(out / "test_names.txt")
    assert other["rows"] == info["rows"]
    # names= keeps the records of a sample only.
    some = EXPECTED_ROWS[:20] + ["nolabels"]
    sub = pypi.build(out.parent / "records.jsonl", out.parent / "sub", names=some)
    kept = [n for p in ("train", "test") for n in lines(out.parent / "sub" / f"{p}_names.txt")]
    assert set(kept) <= set(EXPECTED_ROWS[:20]) and len(kept) >= 15
    assert sub["build"]["records_sampled"] == 21


def test_features_are_tf_idf_of_training_words_l2_normalized(built):
    out, info, train, test = built
    feats = lines(out / "features.txt")
    assert train.n_features == test.n_features == len(feats) == info["features"]
    by_name = {r["name"]: r for r in RECORDS if r["status"] == "ok"}  # the later dupe wins
    train_names = lines(out / "train_names.txt")
    df = Counter(t for n in train_names for t in set(words(by_name[n])))
    assert set(feats) == {t for t, c in df.items() if c >= 2}
    assert [df[t] for t in feats] == sorted((df[t] for t in feats), reverse=True)
    for part, ds in (("train", train), ("test", test)):
        for i, name in enumerate(lines(out / f"{part}_names.txt")):
            tf = Counter(t for t in words(by_name[name]) if df[t] >= 2)
            want = {t: (1 + math.log(c)) * (math.log(train.n_rows / df[t]) + 1)
                    for t, c in tf.items()}
            norm = math.sqrt(sum(v * v for v in want.values()))
            a, b = ds.indptr[i], ds.indptr[i + 1]
            got = {feats[j]: float(v) for j, v in zip(ds.indices[a:b], ds.values[a:b])}
            assert got.keys() == want.keys(), name
            for t, v in want.items():
                assert got[t] == pytest.approx(v / norm, rel=1e-5), (name, t)
        rows = np.repeat(np.arange(ds.n_rows), np.diff(ds.indptr))
        np.testing.assert_allclose(np.bincount(rows, weights=ds.values.astype(float) ** 2), 1.0,
                                   rtol=1e-5)


def test_rows_without_a_feature_go_and_their_labels_are_recounted(tmp_path):
    extra = [rec("zzqx", "Vbnmq.", None, "unobtainium, cli", [DEVS]),  # no word seen twice
             rec("metal-works", "Metal works.", "A python package for metal works.",
                 "unobtainium", COMMON + [DEVS, "Environment :: Console"])]
    info = pypi.build(write_records(tmp_path / "r.jsonl", RECORDS + extra), tmp_path, seed=3)
    names = lines(tmp_path / "train_names.txt") + lines(tmp_path / "test_names.txt")
    assert sorted(names) == sorted(EXPECTED_ROWS + ["metal-works"])
    # unobtainium was on 2 rows until zzqx went: on 1 row, it is no label.
    assert "kw:unobtainium" not in lines(tmp_path / "labels.txt")
    assert info["labels"] == len(lines(tmp_path / "labels.txt"))
    for part in ("train", "test"):
        ds = load_dataset(tmp_path / f"{part}.txt", use_cache=False)
        assert np.diff(ds.indptr).min() >= 1 and np.diff(ds.label_indptr).min() >= 1
        assert (ds.label_frequencies() > 0).sum() >= 1


def test_build_twice_gives_identical_files(tmp_path):
    src = write_records(tmp_path / "records.jsonl")
    # The records file's order does not matter either (the fetch appends in arrival order).
    shuffled = write_records(tmp_path / "shuffled.jsonl",
                             [RECORDS[i] for i in np.random.default_rng(0).permutation(
                                 len(RECORDS)) if RECORDS[i]["name"] != "dupe"]
                             + [r for r in RECORDS if r["name"] == "dupe"])
    pypi.build(src, tmp_path / "a", seed=5)
    first = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    pypi.build(src, tmp_path / "a", seed=5)
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == first
    pypi.build(shuffled, tmp_path / "b", seed=5)
    again = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    assert set(again) == set(first) and len(first) == 7
    for k in first:
        if k != "info.json":  # which records file it was built from
            assert again[k] == first[k], k


def test_malformed_or_empty_records_name_the_file_and_line(tmp_path):
    good = "".join(json.dumps(r) + "\n" for r in RECORDS[:3])
    cases = [("not json", "not valid JSON"), ('["a list"]', "expected a JSON object"),
             ('{"summary": "no name"}', "'name' must be a non-empty string"),
             ('{"name": "x", "classifiers": "Topic :: A"}', "'classifiers' must be a list"),
             ('{"name": "x", "summary": 3}', "'summary' must be a string or null")]
    for bad, what in cases:
        p = tmp_path / "records.jsonl"
        p.write_text(good + "\n" + bad + "\n" + good)  # a blank line 4, the bad one 5
        with pytest.raises(DataError, match=re.escape(f"{p}:5: {what}")):
            pypi.build(p, tmp_path / "out")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=re.escape(f"{empty}: empty records file")):
        pypi.build(empty, tmp_path / "out")
    with pytest.raises(ValueError, match="no label is on 2 rows"):
        pypi.build(write_records(tmp_path / "few.jsonl", RECORDS[:1]), tmp_path / "out")


def test_keyword_and_classifier_rules():
    assert pypi.keyword_labels("Machine Learning,  AI., ,c++, #python, \"nlp\"") == [
        "kw:machine learning", "kw:ai", "kw:c++", "kw:python", "kw:nlp"]
    assert pypi.keyword_labels("web  API web") == ["kw:web", "kw:api"]
    assert pypi.keyword_labels(LONG_KW + ", ok") == ["kw:ok"]
    assert pypi.keyword_labels(None) == pypi.keyword_labels("") == []
    assert pypi.classifier_labels([MIT, PY3, OSI, BETA, "Programming Language :: C", DJANGO,
                                   "Environment :: Web Environment"]) == [
        f"cls:{DJANGO}", "cls:Environment :: Web Environment"]


# ----------------------------------------------------------------------------- fetch


class FakePyPI(http.server.ThreadingHTTPServer):
    """The simple index (HTML, as PyPI answers it) and the JSON API of a few projects."""

    def __init__(self, names):
        super().__init__(("127.0.0.1", 0), Handler)
        self.names = names
        self.requests = Counter()
        self.lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as PyPI

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        with srv.lock:
            srv.requests[self.path] += 1
        m = re.fullmatch(r"/pypi/([^/]+)/json", self.path)
        if self.path == "/simple/":
            body = ("<!DOCTYPE html><html><body>\n" + "".join(
                f'<a href="/simple/{n.lower()}/">{n}</a>\n' for n in srv.names)
                + "</body></html>").encode()
            code = 200
        elif m and m[1] in srv.names and not m[1].startswith(("gone", "broken")):
            n = m[1]
            info = {"name": n, "summary": f"The {n} package.", "description": "x" * 5000,
                    "keywords": "tools, demo", "classifiers": [MIT, DEVS], "version": "1.0"}
            body = json.dumps({"info": info, "releases": {"1.0": [{"size": 1}]}}).encode()
            code = 200
        else:
            body, code = b"no", 500 if m and m[1].startswith("broken") else 404
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    names = [f"proj{i:02d}" for i in range(16)] + ["gone1", "broken1"]
    srv = FakePyPI(names)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_fetch_keeps_the_fields_resumes_and_requests_nothing_twice(tmp_path, server):
    base = f"http://127.0.0.1:{server.server_address[1]}"
    kw = dict(index_url=base + "/simple/", project_url=base + "/pypi/{name}/json", retries=1,
              progress_every=0.0)
    out = tmp_path / "cache"
    got = pypi.fetch(out, 18, seed=2, workers=3, **kw)
    recs = pypi.read_records(out / "records.jsonl")
    assert sorted(r["name"] for r in recs) == sorted(server.names) == sorted(got["wanted"])
    by = {r["name"]: r for r in recs}
    assert by["gone1"]["status"] == "not_found"
    assert by["broken1"]["status"] == "error" and by["broken1"]["error"] == "HTTP 500"
    assert server.requests["/pypi/broken1/json"] == 2  # one retry
    assert by["proj03"] == {"name": "proj03", "status": "ok", "summary": "The proj03 package.",
                            "description": "x" * 4000, "keywords": "tools, demo",
                            "classifiers": [MIT, DEVS]}
    assert (got["ok"], got["not_found"], got["error"]) == (16, 1, 1)
    assert got["index_names"] == 18 and (out / "index.txt").read_text().count("\n") == 18

    # Again: no request at all (the index is cached too), no file changes.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    n_requests = sum(server.requests.values())
    pypi.fetch(out, 18, seed=2, workers=3, **kw)
    assert sum(server.requests.values()) == n_requests
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    # An append cut short: the partial line goes, its name (and only it) is fetched again.
    lines_ = (out / "records.jsonl").read_bytes().split(b"\n")[:-1]
    last = json.loads(lines_[-1])["name"]
    (out / "records.jsonl").write_bytes(b"\n".join(lines_[:-1]) + b"\n" + lines_[-1][:20])
    requests = Counter(server.requests)
    pypi.fetch(out, 18, seed=2, workers=3, **kw)
    assert server.requests - requests == Counter({f"/pypi/{last}/json": 1 + (last == "broken1")})
    assert len(pypi.read_records(out / "records.jsonl")) == 18


def test_a_smaller_sample_is_part_of_a_larger_one(tmp_path, server):
    base = f"http://127.0.0.1:{server.server_address[1]}"
    kw = dict(index_url=base + "/simple/", project_url=base + "/pypi/{name}/json", retries=0)
    small = pypi.fetch(tmp_path, 6, seed=7, workers=2, **kw)["wanted"]
    requests = Counter(server.requests)
    large = pypi.fetch(tmp_path, 10, seed=7, workers=2, **kw)["wanted"]
    assert large[:6] == small
    assert sorted(server.requests - requests) == sorted(f"/pypi/{n}/json" for n in large[6:])
    # retry_failed asks again for the failed names of the sample only (gone1 is not failed).
    assert {"broken1", "gone1"} <= set(large)
    requests = Counter(server.requests)
    pypi.fetch(tmp_path, 10, seed=7, workers=2, retry_failed=True, **kw)
    assert server.requests - requests == Counter({"/pypi/broken1/json": 1})


def test_the_module_is_the_cli_command(tmp_path):
    """`python -m hvd_adaptive.data.pypi` runs `hvd-adaptive data pypi`: an unknown option is
    refused by its parser, whose defaults are the documented ones."""
    with pytest.raises(SystemExit) as e:
        pypi.main(["--out", str(tmp_path), "--no-such-option"])
    assert e.value.code == 2
    assert build_parser().parse_args(["data", "pypi", "--out", "x"]).projects == 80000
