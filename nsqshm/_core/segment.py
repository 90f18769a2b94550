"""Named shared-memory segments that no other process ever sees half made.

On Linux a POSIX shm name is a file in /dev/shm (a tmpfs): shm_open("/x")
opens /dev/shm/x.  shm_open(O_EXCL) then ftruncate leaves a moment in which
another process attaching finds 0 bytes, or a header not yet written (two
workers subscribing to a new channel at once dropped connections on it).
So a segment is made unnamed and published whole:

    fd = create(size)       an O_TMPFILE in /dev/shm, mode 0600, size bytes
    ... map fd, write the header, magic last ...
    publish(fd, name)       link(2) it under its name; fails if the name exists

link(2) never replaces a name, so of two processes creating one segment one
wins and the other attaches to the winner's complete segment.  A process
that dies before publish leaves nothing: an unnamed file goes with its last
descriptor.  (Where O_TMPFILE or /proc is missing a hidden ".nsqshm-tmp-..."
name is used and unlinked after the link -- a process killed in between
leaves that file behind; valid segment names never start with a dot.)

A name is removed only with the segment the remover has in hand
(unlink(name, of=identity(fd))): a segment deleted and made again under
its name by another process is left alone.
"""

import errno
import fcntl
import os
import stat

import posix_ipc

SHM_DIR = "/dev/shm"
MODE = 0o600
# an unnamed file is linked through /proc/self/fd: without /proc, or once the
# kernel refused O_TMPFILE, a hidden temporary name is used instead
use_tmpfile = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")


def path_of(name):
    """The file of segment `name` (already validated by its class: no '/')."""
    return f"{SHM_DIR}/{name}"


def create(size):
    """A new unnamed segment of `size` zero bytes, mode 0600: its descriptor."""
    global use_tmpfile
    fd, tmp = -1, None
    if use_tmpfile:
        try:
            fd = os.open(SHM_DIR, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, MODE)
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            use_tmpfile = False
    if fd < 0:
        tmp = f"{SHM_DIR}/.nsqshm-tmp-{os.getpid()}-{os.urandom(6).hex()}"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW,
                     MODE)
    try:
        os.fchmod(fd, MODE)  # umask may have narrowed it; be exact
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        if tmp:
            os.unlink(tmp)
        raise
    if tmp:
        _named_tmp[fd] = tmp
    return fd


_named_tmp = {}  # fd -> its hidden name, where O_TMPFILE was not available


def publish(fd, name):
    """Give the complete segment behind fd its name, atomically; raises
    posix_ipc.ExistentialError if the name exists (the fd stays open)."""
    tmp = _named_tmp.get(fd)
    src = tmp if tmp else f"/proc/self/fd/{fd}"
    # linkat(AT_SYMLINK_FOLLOW) through /proc/self/fd links the open file;
    # CPython calls plain link(2), which does not follow, unless given a dir fd
    shm_dir = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(src, name, dst_dir_fd=shm_dir, follow_symlinks=True)
    except FileExistsError:
        raise posix_ipc.ExistentialError(f"Shared memory with the specified name "
                                         f"already exists: {name!r}") from None
    finally:
        os.close(shm_dir)
        if tmp:
            del _named_tmp[fd]
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def discard(fd):
    """Close an unpublished segment's descriptor (and remove a hidden name)."""
    tmp = _named_tmp.pop(fd, None)
    os.close(fd)
    if tmp:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def attach(name, error):
    """(fd, size) of the existing segment `name`; posix_ipc.ExistentialError
    if there is none, `error` if it is not a regular file."""
    try:
        fd = os.open(path_of(name), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise posix_ipc.ExistentialError(f"No shared memory exists with the specified "
                                         f"name: {name!r}") from None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise error(f"segment {name!r} is not a shared-memory file "
                        f"({os.strerror(err.errno)})") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"segment {name!r} is not a shared-memory file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def identity(fd):
    """What tells one segment from another made later under the same name."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def unlink(name, of=None, before=None):
    """Remove segment `name`; False if it was not there, or, with `of` (the
    identity() of a segment the caller has), if the name now belongs to
    another segment.  `before(fd)` runs just before the name goes (its
    companion files: a ring's FIFOs), only when it goes, with the locked
    descriptor of what the name refers to (-1: not a file we could open).

    A topic deleted on one worker can be made again there (a PUB) before the
    other worker has applied the delete: that worker's unlink must not take
    the new ring's name.  Comparing, then unlinking is check-then-act, so
    every unlink locks the file the name refers to (flock) and checks that
    the name still refers to it: no other unlink can remove that name
    meanwhile, and no segment can be published under it (link(2) fails on an
    existing name).  Hence the name goes only with the segment it was
    checked against."""
    path = path_of(name)
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            fd = -1  # a symlink or a socket squatting the name: not ours to lock
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
                locked = identity(fd)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    return False  # another unlink took it while we waited
                if (st.st_dev, st.st_ino) != locked:
                    continue  # removed and made again while we waited: look again
                if of is not None and tuple(of) != locked:
                    return False
            elif of is not None:
                return False
            if before is not None:
                before(fd)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            return True
        finally:
            if fd >= 0:
                os.close(fd)
