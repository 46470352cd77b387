"""AgentDojo under a compromised model, through tether's executor and safety policy."""
