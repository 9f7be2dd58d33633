"""The admin API: Powertools REST resolver, pydantic request/response models, error mapping."""
