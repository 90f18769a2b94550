# A message key's partition, CRC-32C of the key's bytes in C (keyhash.pyx).
# Nothing to declare: no cdef class, enum or function here for another module to cimport.
