"""`nsqshm admin`: a drop-in for nsqadmin 1.3 (its flags, URLs and JSON API),
with server-rendered pages (Jinja templates, a small static script for live
numbers, the rate chart and the actions).  See docs/nsqadmin.md."""
