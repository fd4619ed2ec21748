"""Who is this request, and which exact token ids does the engine hold for it: sessions, chat template, token ids."""
