# CPython's bytearray object, for reads that keep a buffer's capacity between
# them (wire.recv_append, wire.drop_front): the fields PyByteArray_Resize uses.

cdef extern from "Python.h":
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc    # bytes allocated at ob_bytes
        char *ob_bytes         # the allocation
        char *ob_start         # the logical start of the data, within ob_bytes
        Py_ssize_t ob_exports  # live buffer views: no resize while > 0
    void Py_SET_SIZE(object o, Py_ssize_t size)
