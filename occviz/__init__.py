"""occviz: a dashboard that makes concurrency contention on PostgreSQL visible."""
