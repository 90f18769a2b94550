# The commit log's classes and the C layout they share (includes/commitlog_layout.h).

from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef extern from "commitlog_layout.h" nogil:
    uint64_t NSQSHM_LOG_MAGIC
    uint32_t NSQSHM_LOG_VERSION
    uint32_t NSQSHM_LOG_STATE_SIZE
    uint32_t NSQSHM_LOG_RECORD_HEADER
    uint32_t NSQSHM_LOG_INDEX_HEADER
    uint32_t NSQSHM_LOG_INDEX_ENTRY
    uint32_t NSQSHM_LOG_TIME_ENTRY

    ctypedef struct nsqshm_log_commit:
        uint64_t start_offset
        uint64_t start_virtual
        uint64_t next_offset
        uint64_t virtual_end
        uint64_t active_base_offset
        uint64_t active_base_virtual
        uint64_t commit_ns

    ctypedef struct nsqshm_log_state:
        uint64_t magic
        uint32_t version
        uint32_t index_interval
        uint64_t segment_bytes
        uint32_t writer_pid
        uint64_t generation
        nsqshm_log_commit slot[2]
        uint64_t synced_offset

    void nsqshm_log_publish(nsqshm_log_state *s, const nsqshm_log_commit *c)
    int nsqshm_log_read_commit(const nsqshm_log_state *s, nsqshm_log_commit *out)
    uint32_t nsqshm_be32(const void *p)
    uint64_t nsqshm_be64(const void *p)
    void nsqshm_put_be32(void *p, uint32_t v)
    void nsqshm_put_be64(void *p, uint64_t v)
    uint32_t nsqshm_crc32c(uint32_t crc, const void *p, size_t n)
    uint32_t nsqshm_crc32c_software(uint32_t crc, const void *p, size_t n)

cdef class _Map:
    cdef int fd
    cdef char *base
    cdef size_t mapped
    cdef readonly str path
    cdef int open(self, str path) except -1
    cdef int ensure(self, size_t need, size_t hint) except -1
    cdef void close(self) noexcept


cdef class _Segment:
    cdef public uint64_t base_offset
    cdef public uint64_t base_virtual
    cdef public uint64_t end_offset     # one past its last committed record
    cdef public uint64_t end_pos        # its committed bytes
    cdef uint64_t file_size             # last size seen by fstat (active segment)
    cdef _Map data
    cdef _Map idx
    cdef _Map tidx
    cdef int open(self, str path, uint64_t base) except -1
    cdef uint64_t index_entries(self) except? 0
    cdef uint64_t time_entries(self) except? 0
    cdef void close(self) noexcept


# a reader's consumer of whole messages, in place in the mmap'd segment
# (LogReader.records): 1 takes the message and asks for the next, 0 leaves it
ctypedef int (*RecordSink)(object ctx, const char *msg, uint32_t size) except -1


cdef class LogReader:
    cdef int state_fd
    cdef nsqshm_log_state *state
    cdef readonly str path
    cdef list segs                 # _Segment, by base offset
    cdef uint64_t seg_start, seg_active   # the commit the list was made for
    cdef nsqshm_log_commit commit  # the last commit read
    cdef uint64_t segment_bytes
    # where the last read_into stopped: the next call from there walks on
    cdef uint64_t hint_offset, hint_pos
    cdef Py_ssize_t hint_seg

    cdef int refresh(self) except -1
    cdef int _out_of_range(self, uint64_t offset) except -1
    cdef Py_ssize_t _seg_of(self, uint64_t offset)
    cdef int _map_data(self, _Segment seg) except -1
    cdef uint64_t _pos_of(self, _Segment seg, uint64_t offset) except? 0xFFFFFFFFFFFFFFFF
    cdef Py_ssize_t _start(self, uint64_t offset, uint64_t *pos) except -2
    cdef _Segment _segment_at(self, Py_ssize_t *si, uint64_t *pos, const char **base,
                              uint64_t *end_pos)
    cdef tuple _read_into(self, uint64_t offset, object buffer, Py_ssize_t max_records,
                          Py_ssize_t max_bytes, bint verify)
    cdef uint64_t _ts_at(self, _Segment seg, uint64_t pos)
    cdef uint64_t _virtual(self, uint64_t offset) except? 0xFFFFFFFFFFFFFFFF
    cdef int64_t virtual_of(self, uint64_t offset) noexcept
    cdef Py_ssize_t records(self, uint64_t offset, Py_ssize_t max_records, RecordSink sink,
                            object ctx, uint64_t *next_offset) except -1


cdef class _Pending:
    cdef char *buf
    cdef Py_ssize_t used, cap
    cdef char *reserve(self, Py_ssize_t n) except NULL


cdef class PartitionLog:
    cdef readonly str path
    cdef readonly uint64_t segment_bytes
    cdef readonly uint32_t index_interval
    cdef readonly uint32_t max_msg_size
    cdef readonly long long sync_every
    cdef readonly double sync_timeout
    cdef int state_fd
    cdef nsqshm_log_state *state
    cdef nsqshm_log_commit c         # what is committed (this process's copy)
    cdef int dfd, ifd, tfd           # the active segment's data, index, time index
    cdef uint64_t wpos               # active segment: bytes written
    cdef uint64_t isize, tsize       # its index files' sizes
    cdef uint64_t last_idx_pos       # position of the last index entry (0: none)
    cdef uint64_t max_ts             # max timestamp of every record so far
    cdef char *staging
    cdef _Pending pidx, ptim
    cdef readonly long long unsynced
    cdef double last_sync
    cdef object logf
    cdef LogReader _reader
    cdef list finished_fds           # segments rolled since the last sync: fsync them then

    cdef int _commit(self) except -1
    cdef int _close_active(self) except -1
    cdef int _roll(self) except -1
    cdef int _flush_index(self) except -1
    cdef int _account(self, uint64_t pos, uint64_t offset, uint64_t ts) except -1
    cdef int _write_staged(self, Py_ssize_t staged, uint64_t next_off) except -1
