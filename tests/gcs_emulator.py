"""gcp-storage-emulator, with the generation headers real GCS sends on every media download, and the
`ifGenerationMatch` precondition of uploads enforced as GCS enforces it.

    python tests/gcs_emulator.py start --host=127.0.0.1 --port=N --in-memory

GCS answers an object download with `x-goog-generation` and `x-goog-metageneration`; the emulator
(2026.7) leaves them out. gcsfs never asks for them, but TensorStore (Orbax's writer) reads the
generation from that header to make its conditional writes, and without it every OCDBT checkpoint write
fails with "Malformed StorageGeneration". Adding the two headers makes the emulator answer as GCS does;
nothing else changes.

The emulator (2026.7) ignores `ifGenerationMatch` on uploads, which the cache's leases rely on
(`storage.create_exclusive` uploads with `ifGenerationMatch=0`: create only if absent). Real GCS
answers 412 Precondition Failed when the object's generation differs (0: when it exists at all); so
does this wrapper, for the upload requests (`insert`: media, multipart and the start of a resumable
upload). tests/io checks both answers through gcsfs.
"""

import sys
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        obj = None     # the emulator's own handler answers 404
    if obj is not None:
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    return _download(request, response, storage, *args, **kwargs)


_insert = objects.insert


def insert(request, response, storage, *args, **kwargs):
    wanted = request.query.get("ifGenerationMatch")
    if wanted:
        name = (request.query.get("name") or [None])[0]
        if name is None and isinstance(getattr(request, "data", None), dict):   # multipart: name in metadata
            name = (request.data.get("meta") or {}).get("name") or request.data.get("name")
        try:
            generation = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
        except NotFound:
            generation = "0"
        if name is not None and generation != wanted[0]:
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you "
                                     "specified did not hold.", "errors": [{"reason": "conditionNotMet"}]}})
            return None
    return _insert(request, response, storage, *args, **kwargs)


# The server builds its routes from `objects.download` and `objects.insert` when it is imported: patch
# first, then import it.
objects.download = download
objects.insert = insert
from gcp_storage_emulator.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
