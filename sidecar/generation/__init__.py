"""One generation: the engine's output ids in, text and tool calls out (detokenizer, stop strings, tool parsers)."""
