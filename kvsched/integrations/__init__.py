"""kvsched inside other engines: each integration substitutes a certified part for the engine's own."""
