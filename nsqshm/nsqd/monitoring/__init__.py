"""What nsqd tells about itself: /stats, /metrics, statsd."""
