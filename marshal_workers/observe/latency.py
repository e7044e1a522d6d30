"""The handler-latency histogram's buckets, shared by the workers that count calls into them (runtime/channel.py,
one count per bucket in each partition's slot) and the metrics page that shows them (observe/metrics_server.py)."""

# Upper bounds in seconds; after them one bucket for +Inf.  Each bucket counts the calls that took at most its
# bound and more than the one before (not cumulative: the metrics page sums them).
LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
