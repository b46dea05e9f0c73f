"""The spec's endpoint tables as data, read from ../shared/spec/interface-spec.md by hand — kept
apart from hub/openapi.py on purpose, so the document is checked against our reading of the spec,
not against itself.

``ENDPOINTS``: (method, path as the hub serves it) → (section, auth, org). Auth as the spec's key:
``Either`` (PAT or Bearer), ``Bearer``, ``session`` (signed-in dashboard only), ``tunnel`` (tunnel
token), ``public``. ``org``: whether the row is marked Org.
"""

from __future__ import annotations

ENDPOINTS: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("post", "/v1/assistant/chat/completions"): ("Assistant", "session", True),
    ("get", "/v1/assistant/usage"): ("Assistant", "session", True),
    ("get", "/v1/audit-events"): ("Audit", "Either", True),
    ("get", "/v1/billing/tunnel/usage"): ("Billing", "Bearer", True),
    ("get", "/v1/billing/tunnel/usage/records"): ("Billing", "Bearer", True),
    ("get", "/v1/billing/features"): ("Billing", "Either", True),
    ("put", "/v1/billing/features/{feature}"): ("Billing", "Either", True),
    ("get", "/v1/billing/pricing"): ("Billing", "Either", True),
    ("get", "/v1/billing/registry-fallback"): ("Billing", "Either", True),
    ("get", "/v1/billing/usage"): ("Billing", "Either", True),
    ("get", "/v1/cli/tunnel/entitlements"): ("Tunnel sessions", "Either", True),
    ("post", "/v1/cli/tunnel/session"): ("Tunnel sessions", "tunnel", False),
    ("delete", "/v1/cli/tunnel/session/{sid}"): ("Tunnel sessions", "tunnel", False),
    ("post", "/v1/cli/tunnel/session/{sid}/renew"): ("Tunnel sessions", "tunnel", False),
    ("get", "/v1/configurations"): ("Configurations", "Either", True),
    ("post", "/v1/configurations"): ("Configurations", "Either", True),
    ("get", "/v1/configurations/summary"): ("Configurations", "Either", True),
    ("get", "/v1/configurations/{configId}"): ("Configurations", "Either", True),
    ("put", "/v1/configurations/{configId}"): ("Configurations", "Either", True),
    ("get", "/v1/configurations/{configId}/secret-files"): ("Secret files", "Either", True),
    ("post", "/v1/configurations/{configId}/secret-files"): ("Secret files", "Either", True),
    ("delete", "/v1/configurations/{configId}/secret-files/{fileId}"): ("Secret files", "Either", True),
    ("get", "/v1/devices/{deviceId}/secret-files"): ("Secret files", "Either", True),
    ("post", "/v1/devices/{deviceId}/secret-files"): ("Secret files", "Either", True),
    ("delete", "/v1/devices/{deviceId}/secret-files/{fileId}"): ("Secret files", "Either", True),
    ("put", "/v1/fleets/{fleetId}/update-window"): ("Fleet update window", "Either", True),
    ("get", "/v1/fleets/{fleetId}/update-window/check"): ("Fleet update window", "Either", True),
    ("post", "/v1/rollouts/impact"): ("Rollouts", "Either", True),
    ("post", "/v1/rollouts"): ("Rollouts", "Either", True),
    # "-" in the spec's request column: no organisation header; the rollout's own organisation applies
    ("get", "/v1/rollouts/{rollout_id}"): ("Rollouts", "Either", False),
    ("post", "/v1/rollouts/{rollout_id}/pause"): ("Rollouts", "Either", False),
    ("get", "/v1/devices"): ("Devices, fleets and configuration versions", "Either", True),
    ("get", "/v1/devices/{device_id}"): ("Devices, fleets and configuration versions", "Either", True),
    ("post", "/v1/devices/{device_id}/reboot"): ("Devices, fleets and configuration versions", "Either", True),
    ("patch", "/v1/devices/{device_id}"): ("Devices, fleets and configuration versions", "Either", True),
    ("get", "/v1/fleets"): ("Devices, fleets and configuration versions", "Either", True),
    ("post", "/v1/fleets"): ("Devices, fleets and configuration versions", "Either", True),
    ("patch", "/v1/fleets/{fleet_id}"): ("Devices, fleets and configuration versions", "Either", True),
    ("get", "/v1/configurations/{config_id}/versions"): ("Devices, fleets and configuration versions", "Either", True),
    ("post", "/v1/configurations/{config_id}/versions"): ("Devices, fleets and configuration versions", "Either", True),
    # the spec writes {id} on these rows (and {device_id}, {deviceId} on others): each row as written
    ("post", "/v1/devices/{id}/memory-test"): ("Memory test", "Either", True),
    ("post", "/v1/devices/{id}/memory-test/cancel"): ("Memory test", "Either", True),
    ("get", "/v1/devices/{id}/memory-test"): ("Memory test", "Either", True),
    ("get", "/v1/devices/{id}/memory-test/results"): ("Memory test", "Either", True),
    ("post", "/v1/oauth/token"): ("Authentication", "public", False),
}

# Enumerations the spec names, as it spells them.
FEATURE_KEYS = ("telemetry", "signature_policy", "usb_policy", "audit_log")
FEATURE_PATH_ENUM = ("telemetry", "signature_policy", "usb_policy")
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
ROLLOUT_QUEUED = "QUEUED_MAINTENANCE"
SCHEMES = ("ApiTokenAuth", "ApiSecretAuth", "BearerAuth", "TunnelToken")
RATE_HEADERS = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")

# Resources → Memory test, as the spec spells them.
MEMTEST_OUTCOMES = ("pass", "fail", "cancelled", "interrupted", "error")
MEMTEST_VERDICTS = ("ok", "weak_cells", "data_line", "address_line", "thermal", "unknown")
MEMTEST_PHASES = ("idle", "preparing", "stopping_workload", "rebooting", "kernel_sweep", "testing", "confirming",
                  "retiring", "restoring", "done", "failed", "cancelled", "interrupted")
MEMTEST_STATUS_MEMBERS = ("source", "supported", "status", "health", "history", "healthReportedAt")
MEMTEST_RUN_MEMBERS = ("runId", "plan", "phase", "pass", "passes", "pattern", "testedBytes", "coverageBytes",
                       "totalBytes", "rateBps", "etaSeconds", "errors", "confirmedErrors", "tempMilliC", "startedAt")
MEMTEST_RESULT_MEMBERS = ("runId", "plan", "source", "startedAt", "finishedAt", "outcome", "verdict", "summary",
                          "passesCompleted", "patternsRun", "testedBytes", "coverageBytes", "totalBytes",
                          "maxTempMilliC", "kernel", "errors", "errorCount", "retired", "fault", "interrupted", "pages")
MEMTEST_ERROR_FIELDS = ("physAddr", "expected", "actual", "mask", "pattern", "pass", "tempMilliC", "confirmed")
MEMTEST_ERRORS_KEPT = 256
RETRY_AFTER = "Retry-After"
