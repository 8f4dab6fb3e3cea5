"""Tests for hvd_adaptive.data.npm: the crawl of npm manifests (levels, order, the cut at the
wanted size, resume, statuses) against a local registry server, and the data set built from
its records."""
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter

import pytest

from hvd_adaptive.cli import build_parser
from hvd_adaptive.data import load_dataset
from hvd_adaptive.data import npm, pypi

# name -> (description, keywords, dependencies); "gone" answers 404, "broken" 500.
PACKAGES = {
    "web": ("A web server framework", ["http", "server"], {"router": "^1", "zlib-x": "^2"}),
    "@ui/core": ("User interface components", "ui, components", {"dom-kit": "1", "web": "2"}),
    "router": ("Routes http requests", ["http", "routing"], {"gone": "1", "broken": "1"}),
    "zlib-x": ("Compression streams for http", ["compression", "http"], {"aaa": "1"}),
    "dom-kit": ("Components for the dom", ["ui", "dom"], {"@ui/core": "1", "not a name!": "1"}),
    "aaa": ("Routing and compression helpers", ["routing", "compression"], {}),
}


class FakeRegistry(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests = Counter()
        self.lock = threading.Lock()
        self.hold = {}  # name -> threading.Event its answer waits for


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        with self.server.lock:
            self.server.requests[self.path] += 1
        name = urllib.parse.unquote(self.path[1:].rsplit("/latest", 1)[0])
        if name in self.server.hold:
            self.server.hold[name].wait(60)
        if name in PACKAGES and self.path.endswith("/latest"):
            desc, kw, deps = PACKAGES[name]
            body = json.dumps({"name": name, "version": "1.0.0", "description": desc,
                               "keywords": kw, "dependencies": deps,
                               "devDependencies": {"tester": "1"} if name == "web" else {}})
            code = 200
        else:
            body, code = "no", 500 if name == "broken" else 404
        body = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def registry():
    srv = FakeRegistry()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv
    for held in srv.hold.values():
        held.set()
    srv.shutdown()
    srv.server_close()


def test_the_crawl_takes_levels_in_name_order_up_to_the_wanted_size(tmp_path, registry):
    url, srv = registry
    kw = dict(seeds=("web", "@ui/core"), registry_url=url, retries=1, progress_every=0.0)
    got = npm.fetch(tmp_path, 7, workers=3, **kw)
    # Level 0: the seeds in name order; level 1: what they depend on, not taken before, in
    # name order; level 2 cut at the wanted size (gone before router's other names).
    assert got["wanted"] == ["@ui/core", "web", "dom-kit", "router", "tester", "zlib-x", "aaa"]
    assert got["levels"] == [2, 4, 1]
    assert (got["ok"], got["not_found"], got["error"]) == (6, 1, 0)
    by = pypi.latest_records(pypi.read_records(tmp_path / "records.jsonl"))
    assert by["web"] == {"name": "web", "status": "ok", "summary": "A web server framework",
                         "description": None, "keywords": "http,server", "classifiers": [],
                         "deps": ["router", "tester", "zlib-x"]}
    assert by["@ui/core"]["keywords"] == "ui, components"
    assert by["dom-kit"]["deps"] == ["@ui/core"]  # the key that is no package name dropped
    assert by["tester"]["status"] == "not_found"
    assert "gone" not in by and "broken" not in by  # beyond the wanted size: not requested
    assert srv.requests["/@ui/core/latest"] == 1
    assert json.loads((tmp_path / "fetch.json").read_text())["levels"] == [2, 4, 1]

    # Again: no request, no file changed. A larger sample requests only the new names, and
    # the failed one once more than its retries only with retry_failed.
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    n = sum(srv.requests.values())
    assert npm.fetch(tmp_path, 7, workers=3, **kw)["wanted"] == got["wanted"]
    assert sum(srv.requests.values()) == n
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    requests = Counter(srv.requests)
    more = npm.fetch(tmp_path, 20, workers=3, **kw)
    assert more["wanted"][:7] == got["wanted"]
    assert more["wanted"][7:] == ["broken", "gone"]  # router's deps; aaa depends on nothing
    assert srv.requests - requests == Counter({"/broken/latest": 2, "/gone/latest": 1})
    assert (more["error"], more["not_found"]) == (1, 2)
    requests = Counter(srv.requests)
    npm.fetch(tmp_path, 20, workers=3, retry_failed=True, **kw)
    assert srv.requests - requests == Counter({"/broken/latest": 2})


def test_a_crawl_killed_midway_has_dated_its_records_and_resumes(tmp_path, registry):
    """The crawl writes fetch.json before its first request: a crawl killed in level 1 leaves
    the first fetch's date beside level 0's records, and the resumed crawl keeps that date."""
    url, srv = registry
    srv.hold["router"] = threading.Event()  # level 1 hangs on router
    code = (f"from hvd_adaptive.data import npm; npm.fetch({str(tmp_path)!r}, 7, workers=1, "
            f"seeds=('web', '@ui/core'), registry_url={url!r}, retries=0, progress_every=0.0)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not srv.requests["/router/latest"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.requests["/router/latest"], "the crawl never reached level 1"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    meta = json.loads((tmp_path / "fetch.json").read_text())
    assert meta["first_fetch"] and meta["last_fetch"] is None and meta["source"] == "npm"
    cached = pypi.cached_records(tmp_path / "records.jsonl")
    assert {"@ui/core", "web", "dom-kit"} <= set(cached) and "router" not in cached
    srv.hold["router"].set()
    got = npm.fetch(tmp_path, 7, workers=1, seeds=("web", "@ui/core"), registry_url=url,
                    retries=0, progress_every=0.0)
    assert got["first_fetch"] == meta["first_fetch"] and got["last_fetch"] >= got["first_fetch"]
    assert srv.requests["/web/latest"] == 1  # level 0 came from the cache
    assert len(got["wanted"]) == 7


def test_the_data_set_has_keywords_as_labels_and_words_as_features(tmp_path, registry):
    url, _ = registry
    meta = npm.fetch(tmp_path, 20, workers=2, seeds=("web", "@ui/core"), registry_url=url,
                     retries=0, progress_every=0.0)
    info = pypi.build(tmp_path / "records.jsonl", tmp_path, test_fraction=0.3, seed=1,
                      min_label_count=2, min_feature_df=1, fetch_info=meta, names=meta["wanted"])
    labels = (tmp_path / "labels.txt").read_text().split()
    # Keywords on two rows or more; "server" and "dom" are on one row each.
    assert sorted(labels) == ["kw:compression", "kw:http", "kw:routing", "kw:ui"]
    assert info["fetch"]["source"] == "npm" and "wanted" not in info["fetch"]
    names = ((tmp_path / "train_names.txt").read_text() + (tmp_path / "test_names.txt").read_text())
    # Every package with a label, but web: the split put it in the test rows, and none of its
    # words ("web", "server", "framework") is on a training row.
    assert sorted(names.split()) == sorted(["@ui/core", "router", "zlib-x", "dom-kit", "aaa"])
    train = load_dataset(str(tmp_path / "train.txt"))
    feats = (tmp_path / "features.txt").read_text().split()
    assert "http" in feats and "components" in feats  # description words
    assert train.n_labels == 4 and train.n_features == len(feats)


def test_the_command_crawls_builds_and_says_what_it_wrote(tmp_path, registry, capsys):
    url, srv = registry
    info = npm.run(tmp_path, packages=20, workers=2, min_feature_df=1, test_fraction=0.3,
                   registry_url=url, seeds=("web", "@ui/core"))
    out = capsys.readouterr().out
    assert "the crawl ran out of names at 9 packages (of 20 wanted)" in out
    assert (f"wrote {tmp_path}: {info['rows']['train']} train and {info['rows']['test']} test "
            f"rows, {info['features']} features, 4 labels") in out
    assert json.loads((tmp_path / "info.json").read_text()) == info
    assert load_dataset(str(tmp_path / "test.txt")).n_labels == 4
    # Again: the cache answers, nothing is requested, the same files.
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    n = sum(srv.requests.values())
    npm.run(tmp_path, packages=20, workers=2, min_feature_df=1, test_fraction=0.3,
            registry_url=url, seeds=("web", "@ui/core"))
    assert sum(srv.requests.values()) == n
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_bad_arguments_and_the_cli_command(tmp_path, capsys):
    with pytest.raises(ValueError, match="seeds must be npm package names"):
        npm.fetch(tmp_path, 5, seeds=("fine", "no spaces"))
    with pytest.raises(ValueError, match="n_packages"):
        npm.fetch(tmp_path, 0)
    assert not (tmp_path / "records.jsonl").exists()
    with pytest.raises(SystemExit) as e:
        npm.main(["--out", str(tmp_path), "--no-such-option"])
    assert e.value.code == 2
    assert build_parser().parse_args(["data", "npm", "--out", "x"]).packages == 30000
    # An output folder that cannot be made, and a damaged cache: one line naming it, exit 2,
    # the cache left as it was (nothing is requested before the cache is read).
    capsys.readouterr()
    (tmp_path / "a-file").write_text("x")
    assert npm.main(["--out", str(tmp_path / "a-file" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvd-adaptive data npm: error: ") and "a-file" in err and err.count("\n") == 1
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "records.jsonl").write_text('{"name": "web", "status": "ok"}\nnot json\n')
    assert npm.main(["--out", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'cache' / 'records.jsonl'}:2: not valid JSON" in err, err
    assert (tmp_path / "cache" / "records.jsonl").read_text().endswith("not json\n")
