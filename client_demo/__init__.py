"""A demo model gateway and chat subscriber for token-relay."""
