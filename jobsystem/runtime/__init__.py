"""What the middleware share while messages run: coalesced store calls, deferred writes,
re-enqueues, attempt notes, refused follow-ups and the shape of a message."""
