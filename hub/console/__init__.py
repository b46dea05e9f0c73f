"""The operators' web console (issue 18): pages under /console/, served by the hub on the API's origin.

No build step: every page is the same small HTML shell (``pages.py``) naming its page, and plain ES
modules from ``static/`` render it by calling the /v1 API with the dashboard session cookie and the
CSRF token, and follow the live parts over the SSE streams (``stream.py`` adds the organisation-wide
device stream the device list needs, ``usage.py`` the billing page's usage per day,
``deliveries.py`` a secret file's deliveries a page at a time). docs/console.md says what exists and how it is built.
"""

from hub.console.deliveries import bp as deliveries_bp
from hub.console.pages import bp
from hub.console.stream import bp as stream_bp
from hub.console.usage import bp as usage_bp

__all__ = ["bp", "deliveries_bp", "stream_bp", "usage_bp"]
