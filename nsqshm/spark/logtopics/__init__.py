"""The source on log topics: Kafka's offsets, batch and streaming reads of offset ranges, over mmap'd segments or TCP."""
