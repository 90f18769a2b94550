"""Graphite, for nsqadmin's --graphite-url: the /api/graphite rate (the
statsd counter over the last --statsd-interval) and, with --proxy-graphite,
/render forwarded to graphite with the URL's basic auth."""

import base64
from urllib.parse import urlencode, urlsplit

from werkzeug.wrappers import Response

from nsqshm.nsqd.http_api import Err, parse_query, request_path


def rate(admin, req):
    """The {"rate": "12.34"} document (or "N/A"), as nsqadmin's graphiteHandler."""
    values, err = parse_query(req.query_string)
    if err is not None:
        raise Err(400, "INVALID_REQUEST")
    if values.get("metric", [""])[0] != "rate":
        raise Err(400, "INVALID_ARG_METRIC")
    if "target" not in values:
        raise Err(400, "INVALID_ARG_TARGET")
    interval = int(admin.opts.statsd_interval)
    query = urlencode(sorted({"from": f"-{interval * 2}sec", "until": f"-{interval}sec",
                              "format": "json", "target": values["target"][0]}.items()))
    url = f"{admin.opts.graphite_url}/render?{query}"
    admin.log.info(f"GRAPHITE: {url}")
    try:
        response = admin.client.get_v1(url)
    except Exception as exc:
        admin.log.error(f"graphite request failed - {exc}")
        raise Err(500, "INTERNAL_ERROR") from None
    value = response[0]["datapoints"][0][0]  # missing data: a 500, as nsqadmin's panic
    if value < 0:
        return {"rate": "N/A"}
    return {"rate": f"{value / interval if interval else float('inf'):.2f}"}


def proxy(admin, req):
    """/render forwarded to --graphite-url's host (the path kept, as nsqadmin's
    reverse proxy keeps it), with its basic auth if any."""
    target = urlsplit(admin.opts.graphite_url)
    url = f"{target.scheme}://{target.hostname}"
    if target.port:
        url += f":{target.port}"
    url += request_path(req)
    if req.query_string:
        url += "?" + req.query_string.decode("latin-1")
    headers = {}
    if target.username is not None:
        pair = f"{target.username}:{target.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    try:
        status, ctype, body = admin.client.get_raw(url, headers)
    except Exception as exc:
        admin.log.error(f"http: proxy error: {exc}")
        return Response(b"", 502)
    return Response(body, status, content_type=ctype or None)
