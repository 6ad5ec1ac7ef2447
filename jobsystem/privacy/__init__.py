"""Personal data and secrets kept out of every channel: the scrubber and its finders, hashed store
keys, the logging filter that hides job arguments, and their set-up from settings."""
