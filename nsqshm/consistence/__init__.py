"""Cluster coordination through etcd (issue 17): the etcd session, the cluster's
topology after Youzan's layout, and partition leadership with epochs.

Standalone from the broker, as youzan/nsq keeps its consistence/ package: nsqd
and nsqlookupd will call into it; nothing here imports the broker's modules
except the name check (nsqshm.nsqd.names).  docs/consistence.md tells it all.
"""
