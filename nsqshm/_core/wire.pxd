# wire: per-batch conversions between NSQ's wire formats and ring records
