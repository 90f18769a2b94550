"""The Youzan fork of NSQ (youzan/nsq, youzan/go-nsq) on the wire and over HTTP, as pure
codecs (no I/O): what the broker needs to answer Youzan's clients byte for byte.
The spec, with the source of each fact, is docs/youzan.md.

    go_strconv  Go's strconv parsing with its error texts (they reach the wire)
    offset      the consume position "<type>:<value>" (SUB_ADVANCED, /channel/setoffset)
    commands    command lines: SUB/SUB_ADVANCED/SUB_ORDERED, partitioned PUB/MPUB,
                INTERNAL_CREATE_TOPIC, FIN/REQ/TOUCH with binary IDs
    bodies      PUB_TRACE, PUB_EXT, MPUB/MPUB_TRACE/MPUB_EXT bodies; the traced reply
    frames      message frames (plain, ext headers, queue offset + raw size); message IDs
    http        nsqd: /topic/create, /channel/setoffset, /message/get, /pub_ext, /pubtrace
    lookup      nsqlookupd: /lookup with partitions, access and metainfo
    identify    IDENTIFY's desired_tag, extend_support, ext_filter
    client      what youzan/go-nsq sends (tests, load generator)
"""
