"""Billing: the product catalogue, prices in effect per day, billing periods and feature
entitlements (pure modules), and the glue that reads metering for the billing endpoints.
See docs/billing.md."""
