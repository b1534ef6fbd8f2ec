"""Harnesses that measure the app from outside, imported only by `manage.py bench` and the tests.

streaming.py: what watching a job costs it, and how late its events reach viewers.
floor.py: the engine's floor, bare writers that record nothing.
failover.py: how fast a leader election fails over after a kill, over many runs.
"""
