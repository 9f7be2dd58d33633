"""Use cases. Handlers call these; these call the domain and the store/cloud adapters."""
