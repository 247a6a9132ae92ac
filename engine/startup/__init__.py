"""What runs once when an engine starts: the plan turned into a complete EngineConfig, the model
set-up, the kernel choices, and the start-up phases' times."""
