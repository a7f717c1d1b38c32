"""./x clean: removes the shm backend's leftover segments from /dev/shm.

NOTE [stale segments]
A segment is named /dtensor-<job tag>-<group tag> (collectives/shm_segment.h). Its name goes away
as soon as every rank of the group has mapped it (NOTE [shm segment lifetime]); only a job killed
before every rank attached leaves one behind. Such a leftover is recognised by its header
(collectives/shm_segment.h, Header): the creator's pid is dead, or the header was never finished
(no magic) and the file is older than a minute. Segments of live jobs are never touched: a live
creator keeps its segment, and an unfinished header younger than a minute may be one being made.
The same rule runs in C++ when a process creates its first segment (shm::reclaim_stale_segments),
and the launcher (tools/launch.py) removes its own job's segments by tag whatever happened.
"""

import os
import struct
import sys
import time

SHM_DIR = "/dev/shm"
PREFIX = "dtensor-"
MAGIC = 0x33306D6873746E64  # "dtnshm03", shm::kMagic
UNFINISHED_AGE_S = 60.0


def fnv1a(text):
    h = 14695981039346656037
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def job_tag(job):
    """The job's part of its segment names (shm_job_tag in collectives/shm_segment.cc)."""
    return "%016x" % fnv1a(job)


def _alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(path, now=None):
    """Whether the segment at `path` is a leftover (see the NOTE above)."""
    try:
        with open(path, "rb") as f:
            head = f.read(40)
        age = (now or time.time()) - os.stat(path).st_mtime
    except OSError:
        return False
    if len(head) < 40:
        return age > UNFINISHED_AGE_S
    magic, _total, _half, _size, creator = struct.unpack("<QQQqq", head)
    if magic != MAGIC:
        return age > UNFINISHED_AGE_S
    return not _alive(creator)


def remove_stale(shm_dir=SHM_DIR):
    """Removes every stale dtensor segment; returns the names removed."""
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        path = os.path.join(shm_dir, name)
        if name.startswith(PREFIX) and is_stale(path, now):
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed


def remove_job(job, shm_dir=SHM_DIR):
    """Removes every segment of job `job` (its ranks are gone); returns the names removed."""
    prefix = PREFIX + job_tag(job) + "-"
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def main(argv):
    if argv:
        print("usage: ./x clean", file=sys.stderr)
        return 2
    removed = remove_stale()
    for name in removed:
        print(f"removed /dev/shm/{name}")
    print(f"./x clean: {len(removed)} stale segment(s) removed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
