"""Several hub processes over one NATS server and one PostgreSQL (issue 17, docs/cluster.md)."""
