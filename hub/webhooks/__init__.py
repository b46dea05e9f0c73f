"""Webhooks (issue 33, docs/events.md): signing (``signing.py``), one HTTP delivery with its address
checks (``sender.py``), the retry schedule (``schedule.py``) and the per-endpoint delivery loop under a
cluster-wide lease (``worker.py``). The endpoints' storage is storage/webhooks.py, their API
hub/api/webhooks.py."""
