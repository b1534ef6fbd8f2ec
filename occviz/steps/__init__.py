"""Step mode's engine: scripts of SQL steps, one real connection and transaction per actor, stepped one at a time.

`script.parse(text)` validates a script against a small grammar of its own (nothing else
reaches the database); `engine.Session` runs it on fresh rows through a `Dialect`
(PostgreSQL here, `postgres.PostgresDialect`), one thread per actor, and reports every
step's outcome, blocked steps and who blocks them included. It imports nothing of
Django: the scenario (occviz/scenarios/step) and the anomalies suite hand it what it needs.
"""
