"""The interchangeable parts behind one interface each: distributed strategies, precision modes,
trackers, monitoring, model input/output, the planner, and the connector that assembles them
into a Runtime.

Subpackages and modules are imported by their full path; this package imports nothing.
"""
