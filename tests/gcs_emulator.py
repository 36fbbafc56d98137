"""gcp-storage-emulator, with the generation headers real GCS sends on every media download.

    python tests/gcs_emulator.py start --host=127.0.0.1 --port=N --in-memory

GCS answers an object download with `x-goog-generation` and `x-goog-metageneration`; the emulator
(2026.7) leaves them out. gcsfs never asks for them, but TensorStore (Orbax's writer) reads the
generation from that header to make its conditional writes, and without it every OCDBT checkpoint write
fails with "Malformed StorageGeneration". Adding the two headers makes the emulator answer as GCS does;
nothing else changes. (The emulator still does not enforce `ifGenerationMatch`; see DESIGN.md.)
"""

import sys

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


# The server builds its routes from `objects.download` when it is imported: patch first, then import it.
objects.download = download
from gcp_storage_emulator.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
