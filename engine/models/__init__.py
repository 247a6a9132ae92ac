"""Model implementations (Llama family) and the weight loaders."""
