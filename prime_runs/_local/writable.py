"""Whether a runs directory can be written, asked once at ``init()``, with the errno and the path when not.

An offline run keeps everything there, so ``init()`` refuses to start one
whose directory cannot be created or written
(:class:`~prime_runs.errors.RunDirectoryError`).
An online run keeps there only what the service cannot take (an outage, a
slow link, the deadline); it starts anyway, says so at once, and keeps
nothing on disk, rather than promise a ``prime-runs sync`` of a directory
that will never exist.
"""

from __future__ import annotations

import errno
import os
import tempfile

#: Prefix of the file written (and removed at once) to prove a directory writable.
PROBE_PREFIX = ".prime-runs-probe-"


def writable_problem(root: str, *, create: bool) -> OSError | None:
    """Why runs cannot be kept under ``root``, as an ``OSError`` naming errno and path; None if they can.

    ``create``: make ``root`` and write (then remove) a probe file in it, the
    proof an offline run needs. Otherwise nothing is created: the nearest
    existing ancestor must be a directory this process may write, on a
    filesystem mounted read-write.
    """
    if create:
        try:
            os.makedirs(root, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=root)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            return err
        return None
    path = os.path.abspath(root)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.path.isdir(path):
        return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    if hasattr(os, "statvfs") and os.statvfs(path).f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    if not os.access(path, os.W_OK | os.X_OK):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return None
