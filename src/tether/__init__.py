"""tether: a bounded, safe, durable and testable runtime for tool-using LLM agents."""
