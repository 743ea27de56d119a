"""One router per resource, all under ``/v1``; health and metrics at the root."""
