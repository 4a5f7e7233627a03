"""A demo model gateway, chat subscriber and browser chat page for token-relay."""

from pathlib import Path

WEB_ROOT = Path(__file__).parent / "web"
"""The demo page and ``relay-client.js``, served by the relay with ``--web-root``."""
