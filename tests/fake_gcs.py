"""An offline Google Cloud Storage for tests: gcp-storage-emulator's JSON API server, in memory,
in a thread of the test process, with the environment that points both clients gqa_jax uses at it:
gcsfs (behind ``etils.epath``: every file) and TensorStore's gcs driver (orbax's arrays, T5X's
zarr). Subprocesses inherit the environment, so a ``python -m gqa_jax ...`` child writes there too.

Two gaps of the emulator are filled here as real GCS behaves: the JSON API's ``moveTo`` (gcsfs's
rename: a copy and a delete), and the ``x-goog-generation`` header of a download (TensorStore
reads an object's generation from it, e.g. OCDBT's manifest before rewriting it). And its server
queues more connections than socketserver's 5: a recursive move opens one per object at once, the
server takes them one at a time, and each connection refused waited TCP's 1 s before trying again
(the test that trains on gs:// took 17.2 s, 9.7 s so).
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import types
from http import HTTPStatus

BUCKET = "gqa-test-bucket"
BACKLOG = 128  # connections the server queues: more than the 100 aiohttp (gcsfs, epath) opens at once
_STARTED: dict[str, str] = {}  # one server per process: gcsfs caches its filesystem per endpoint


def _patch_emulator() -> None:
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    def move(request, response, storage, *args, **kwargs):
        p = request.params
        bucket, source, dest = p["bucket_name"], p["object_id"], p["dest_object_id"]
        try:
            moved = objects._copy(request.base_url, storage, bucket, source, bucket, dest)
        except NotFound:
            response.status = HTTPStatus.NOT_FOUND
            return
        objects._delete(storage, bucket, source)
        response.json(moved)

    route = (
        rf"^{server.settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
        r"(?P<dest_object_id>.*[^/]+)$",
        {server.POST: move},
    )
    plain_download = objects.download

    def download(request, response, storage, *args, **kwargs):
        plain_download(request, response, storage, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            p = request.params
            obj = storage.get_file_obj(p["bucket_name"], p["object_id"])
            response["x-goog-generation"] = obj["generation"]
            response["x-goog-metageneration"] = obj["metageneration"]

    objects.download = download  # objects.get(alt=media) calls it by this name

    class Backlogged(http.server.HTTPServer):
        request_queue_size = BACKLOG

    server.server = types.SimpleNamespace(HTTPServer=Backlogged)  # what its thread builds its server with
    handlers = [
        (regex, {method: download if fn is plain_download else fn for method, fn in table.items()})
        for regex, table in server.HANDLERS
    ]
    server.HANDLERS = (route, *handlers)


def environment(url: str) -> dict[str, str]:
    """What points gcsfs and TensorStore at ``url`` with no credentials and no network."""
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "offline-test-token",  # TensorStore: no credential lookup
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # no bucket-type query (a Google-only API)
        "GOOGLE_CLOUD_PROJECT": "offline-test",
    }


def start() -> str:
    """Start the fake GCS (once per process), export its environment, return ``gs://BUCKET``."""
    if "url" not in _STARTED:
        from gcp_storage_emulator.server import create_server

        for name in ("gcp_storage_emulator", "gcp_storage_emulator.server"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        _patch_emulator()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
        server._api.daemon = True  # its thread: the test process exits without stopping it
        server.start()
        _STARTED["url"] = f"http://127.0.0.1:{port}"
        os.environ.update(environment(_STARTED["url"]))
    return f"gs://{BUCKET}"


def objects(prefix: str) -> list[str]:
    """The object names under ``gs://BUCKET/prefix`` (read through the emulator's JSON API)."""
    import json
    import urllib.parse
    import urllib.request

    names, token = [], None
    while True:
        query = {"prefix": prefix, **({"pageToken": token} if token else {})}
        url = f"{_STARTED['url']}/storage/v1/b/{BUCKET}/o?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url) as r:
            page = json.load(r)
        names += [item["name"] for item in page.get("items", [])]
        token = page.get("nextPageToken")
        if not token:
            return names


def upload(local_dir: os.PathLike, url: str) -> str:
    """Copy the local directory tree ``local_dir`` to ``url`` (gs://BUCKET/...); returns ``url``."""
    from etils import epath

    for root, _, files in os.walk(local_dir):
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), local_dir)
            with open(os.path.join(root, name), "rb") as f:
                (epath.Path(url) / relative).write_bytes(f.read())
    return url
