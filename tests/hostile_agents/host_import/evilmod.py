"""Imported only if a host resolves the manifest's game id: leaves a canary file and says so."""
import os

_canary = os.environ.get("LUDUS_CANARY")
if _canary:
    with open(_canary, "w") as f:
        f.write("evilmod was imported in pid %d\n" % os.getpid())
env = None
