# A disk queue with go-diskqueue's files, read through mmap, written with pwrite (diskqueue.pyx).


cdef class _Segment:
    cdef int fd
    cdef char *base
    cdef long long mapped
    cdef readonly str path
    cdef int refresh(self) except -1


cdef class DiskQueue:
    cdef readonly str name
    cdef readonly str data_path
    cdef readonly long long max_bytes_per_file
    cdef readonly int min_msg_size
    cdef readonly int max_msg_size
    cdef readonly long long sync_every
    cdef readonly long long depth
    cdef readonly long long read_file_num
    cdef readonly long long read_pos
    cdef readonly long long write_file_num
    cdef readonly long long write_pos
    cdef readonly long long writes_since_sync
    cdef readonly bint dirty
    cdef int wfd                # the current segment, open for writing, or -1
    cdef char *staging          # records laid out for one pwrite (during put_packed)
    cdef _Segment reader
    cdef long long reader_num
    cdef object logf
    cdef object remove          # deletes a fully read segment (the broker: off its loop)
    # where the last peek_into ended, so that advance() of exactly what was
    # peeked is O(1): (records, start file, start pos, end file, end pos)
    cdef Py_ssize_t peek_count
    cdef long long peek_from_num, peek_from_pos, peek_num, peek_pos
    cdef list read_files        # segments read to their end, for _remove_read_files
    # the write position the metadata on disk was last fsynced with
    cdef long long synced_write_num, synced_write_pos

    cdef int _open_writer(self) except -1
    cdef int _close_writer(self, bint finish) except -1
    cdef int _roll(self) except -1
    cdef long long _write(self, const char *buf, long long nbytes) except -2
    cdef int _flush_staging(self, long long pending, Py_ssize_t batch,
                            Py_ssize_t count) except -1
    cdef _Segment _reader_for(self, long long num)
    cdef int _skip_bad(self, str why) except -1
    cdef int _walk(self, char *out, Py_ssize_t room, Py_ssize_t max_records,
                   Py_ssize_t *count_out, Py_ssize_t *bytes_out, bint commit,
                   bint raw) except -1
    cdef int _peek_raw(self, char *out, Py_ssize_t room, Py_ssize_t max_records,
                       Py_ssize_t *count_out, Py_ssize_t *bytes_out) except -1
