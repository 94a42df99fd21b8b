"""Operator tools over the store: explain, capacity, sql, the HTML report."""
