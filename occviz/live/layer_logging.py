"""Quieting the channel layer about jobs that no one is watching.

channels-postgres warns "Group: ... does not exist, did you call group_add?" on
every `group_send` to a group with no members. A job publishes its progress after
each stored batch, about ten times a second, whether or not anyone follows it: for
`runjob` or a job nobody has open, that warning would fill stderr. A group without
members here only means no viewer, so the filter drops that one message and lets
every other record of the layer through.
"""

from __future__ import annotations

import logging


class UnwatchedGroupFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("Group: ") and "group_add" in record.msg)
