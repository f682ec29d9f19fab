"""Durable stores behind IMessageStore: MemoryStore and the embedded SQLiteStore."""
