"""The hub's registry proxy: the pull side of the OCI distribution API, in front of the registries a
fleet's versions name (docs/containers.md, "Registry proxy"; docs/billing.md, "Registry fallback").

upstream.py fetches one object and verifies it, cache.py keeps verified objects on disk and coalesces
concurrent fetches, proxy.py decides who may pull what and meters what is served, routes.py is HTTP.
"""
